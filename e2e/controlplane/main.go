// Command controlplane runs a real, single-process Kubernetes control plane for the
// gpu-tenancy end-to-end tests: embedded etcd plus kube-apiserver (Kubernetes' own code,
// built from its Go modules, the way envtest does it), the garbage collector, namespace and
// serviceaccount controllers of kube-controller-manager (controllers.go), and a kubectl of the
// same version; with --scheduler also kube-scheduler and the ResourceClaim controller
// (scheduler.go), for Dynamic Resource Allocation.
//
//	controlplane up --dir DIR [--die-with-parent=false] [--keep] [--scheduler] [-- extra kube-apiserver flags]
//	controlplane down --dir DIR
//	controlplane status --dir DIR
//	controlplane register-plugin --socket PATH   (the kubelet's own plugin registration)
//	controlplane kubectl ARGS...     (or run through a symlink named kubectl)
//	controlplane version
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"golang.org/x/sys/unix"

	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"

	// Import to initialize client auth plugins (as the real kubectl does).
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

func main() {
	if filepath.Base(os.Args[0]) == "kubectl" {
		runKubectl(os.Args)
		return
	}
	if len(os.Args) < 2 {
		printUsage()
		os.Exit(2)
	}
	switch os.Args[1] {
	case "up":
		if err := cmdUp(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "controlplane up: %v\n", err)
			os.Exit(1)
		}
	case "down":
		if err := cmdDown(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "controlplane down: %v\n", err)
			os.Exit(1)
		}
	case "status":
		if err := cmdStatus(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "controlplane status: %v\n", err)
			os.Exit(1)
		}
	case "register-plugin":
		if err := cmdRegisterPlugin(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "controlplane register-plugin: %v\n", err)
			os.Exit(1)
		}
	case "kubectl":
		runKubectl(os.Args[1:])
	case "version":
		fmt.Println(kubernetesVersion())
	case "-h", "--help", "help":
		printUsage()
	default:
		fmt.Fprintf(os.Stderr, "controlplane: unknown subcommand %q\n", os.Args[1])
		printUsage()
		os.Exit(2)
	}
}

func printUsage() {
	fmt.Fprint(os.Stderr, `usage:
  controlplane up --dir DIR [--die-with-parent=true] [--ready-timeout=120s] [--keep] [--scheduler] [-- EXTRA_KUBE_APISERVER_FLAGS...]
      start embedded etcd + kube-apiserver on 127.0.0.1 (free ports) and the garbage collector,
      namespace and serviceaccount controllers, write DIR/kubeconfig,
      print its path once /readyz answers ok, and run until SIGTERM/SIGINT (or the parent dies).
      --keep: start again on DIR's stopped state (same data, certificates, ports).
      --scheduler: also run kube-scheduler (default profile, DRA included) and the ResourceClaim
      controller, so pods get bound and their claims allocated.
  controlplane down --dir DIR
      stop the control plane recorded in DIR/controlplane.pid and wait until it is gone.
  controlplane status --dir DIR
      exit 0 and print the pid if the control plane recorded in DIR is running, else exit 1.
  controlplane register-plugin --socket PATH [--type DRAPlugin]
      register the kubelet plugin serving PATH with the kubelet's own registration code (its
      plugin watcher's dial, GetInfo, validation and NotifyRegistrationStatus).
  controlplane kubectl ARGS...   (also: invoked through a link named "kubectl")
  controlplane version
`)
}

func runKubectl(args []string) {
	os.Args = args
	logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) // nolint:errcheck
	command := kubectlcmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err)
	}
}

// kubernetesVersion is the k8s.io/kubernetes module version this binary was built from.
func kubernetesVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == "k8s.io/kubernetes" {
				return m.Version
			}
		}
	}
	return "unknown"
}

// ---------------------------------------------------------------------------------------------
// up

func cmdUp(args []string) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	dir := fs.String("dir", "", "state directory (created; previous state in it is discarded)")
	dieWithParent := fs.Bool("die-with-parent", true, "terminate when the parent process exits (Linux PR_SET_PDEATHSIG)")
	readyTimeout := fs.Duration("ready-timeout", 180*time.Second, "how long to wait for /readyz")
	verbosity := fs.Int("v", 0, "kube-apiserver log verbosity")
	keep := fs.Bool("keep", false, "start again on the state an earlier up left in DIR (etcd data, certificates, ports; keep.go)")
	withScheduler := fs.Bool("scheduler", false, "also run kube-scheduler and the ResourceClaim controller (scheduler.go): pods get bound, their ResourceClaims created and allocated")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return errors.New("--dir is required")
	}
	extra := fs.Args()
	if len(extra) > 0 && extra[0] == "--" {
		extra = extra[1:]
	}

	parent := os.Getppid()
	if *dieWithParent {
		if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0, 0, 0); err != nil {
			return fmt.Errorf("prctl(PR_SET_PDEATHSIG): %w", err)
		}
		// The parent may have died before prctl took effect.
		if os.Getppid() != parent {
			return errors.New("parent process exited before start")
		}
	}

	absDir, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	var keptPKI *pki
	var keptPorts []int
	if *keep {
		if keptPKI, keptPorts, err = loadKept(absDir); err != nil {
			return err
		}
	} else if err := prepareDir(absDir); err != nil {
		return err
	}
	pidFile := filepath.Join(absDir, pidFileName)
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	defer os.Remove(pidFile)

	certs, ports := keptPKI, keptPorts
	if !*keep {
		if certs, err = writePKI(filepath.Join(absDir, "pki")); err != nil {
			return fmt.Errorf("generating certificates: %w", err)
		}
		if ports, err = freePorts(3); err != nil {
			return err
		}
		if err := savePorts(absDir, ports); err != nil {
			return err
		}
	}
	etcdClientPort, etcdPeerPort, apiPort := ports[0], ports[1], ports[2]

	// Embedded etcd: same process, so nothing survives this process.
	etcdCfg := embed.NewConfig()
	etcdCfg.Name = "e2e"
	etcdCfg.Dir = filepath.Join(absDir, "etcd")
	etcdCfg.LogLevel = "error"
	etcdCfg.LogOutputs = []string{filepath.Join(absDir, "etcd.log")}
	etcdCfg.UnsafeNoFsync = true // throwaway test data
	cURL := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(etcdClientPort))}
	pURL := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(etcdPeerPort))}
	etcdCfg.ListenClientUrls = []url.URL{cURL}
	etcdCfg.AdvertiseClientUrls = []url.URL{cURL}
	etcdCfg.ListenPeerUrls = []url.URL{pURL}
	etcdCfg.AdvertisePeerUrls = []url.URL{pURL}
	etcdCfg.InitialCluster = etcdCfg.InitialClusterFromName(etcdCfg.Name)
	etcd, err := embed.StartEtcd(etcdCfg)
	if err != nil {
		return fmt.Errorf("starting embedded etcd: %w", err)
	}
	defer etcd.Close()
	select {
	case <-etcd.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		return errors.New("embedded etcd did not become ready within 60s")
	}

	apiArgs := []string{
		"--etcd-servers=" + cURL.String(),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// A loopback advertise address is refused by the endpoint reconcilers; a single test
		// apiserver needs none (the kubernetes Service just gets no endpoints).
		"--endpoint-reconciler-type=none",
		"--secure-port=" + strconv.Itoa(apiPort),
		"--cert-dir=" + filepath.Join(absDir, "pki"),
		"--tls-cert-file=" + certs.servingCert,
		"--tls-private-key-file=" + certs.servingKey,
		"--client-ca-file=" + certs.caCert,
		"--service-account-key-file=" + certs.saPub,
		"--service-account-signing-key-file=" + certs.saKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=RBAC",
		// The default admission chain stays on; this only makes sure the policy plugins are part
		// of it. Both are in 1.37's default-on list (pkg/kubeapiserver/options/plugins.go
		// DefaultOffAdmissionPlugins) and their APIs (admissionregistration.k8s.io/v1
		// validatingadmissionpolicies, mutatingadmissionpolicies; MutatingAdmissionPolicy GA in
		// 1.36) are served by default, so no --runtime-config is needed; naming them keeps them
		// on should a version bump change the defaults.
		"--enable-admission-plugins=ValidatingAdmissionPolicy,MutatingAdmissionPolicy",
		"--allow-privileged=true",
		"--v=" + strconv.Itoa(*verbosity),
	}
	// Every request's metadata (who, verb, resource, response code) in DIR/audit.log: the
	// least-privilege tests compare what a service account was granted with what it used.
	auditArgs, err := auditLog(absDir)
	if err != nil {
		return err
	}
	apiArgs = append(apiArgs, auditArgs...)
	apiArgs = append(apiArgs, extra...)

	cmd := apiserverapp.NewAPIServerCommand() // installs the SIGTERM/SIGINT handler (second signal: exit 1)
	cmd.SetArgs(apiArgs)
	apiDone := make(chan error, 1)
	go func() { apiDone <- cmd.Execute() }()

	// The in-process controllers (controllers.go) stop first on a stop request, and with the process.
	controllersCtx, stopControllers := context.WithCancel(context.Background())
	defer stopControllers()

	// Make sure a stop request ends the process even if a graceful shutdown hangs.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "controlplane: received %v, shutting down\n", s)
		stopControllers()
		time.Sleep(20 * time.Second)
		fmt.Fprintln(os.Stderr, "controlplane: graceful shutdown took too long, exiting")
		os.Remove(filepath.Join(absDir, "ready"))
		os.Remove(pidFile)
		os.Exit(1)
	}()

	kubeconfig := filepath.Join(absDir, "kubeconfig")
	server := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(apiPort))
	if err := writeKubeconfig(kubeconfig, server, certs); err != nil {
		return err
	}

	ctx, cancel := context.WithTimeout(context.Background(), *readyTimeout)
	defer cancel()
	if err := waitReady(ctx, server, certs, apiDone); err != nil {
		return err
	}
	// Garbage collector, namespace and serviceaccount controllers, as kube-controller-manager
	// would run them (and with --scheduler, the ResourceClaim controller and kube-scheduler).
	if err := startControllers(controllersCtx, ctx, kubeconfig, *withScheduler); err != nil {
		return fmt.Errorf("starting controllers: %w", err)
	}
	// The ready marker lets scripts that started us in the background wait for readiness.
	readyFile := filepath.Join(absDir, "ready")
	if err := os.WriteFile(readyFile, []byte(server+"\n"), 0o644); err != nil {
		return err
	}
	defer os.Remove(readyFile)
	fmt.Println(kubeconfig)

	err = <-apiDone
	if err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	return nil
}

// auditLog writes an audit policy logging every request at the Metadata level (no bodies) and
// returns the kube-apiserver flags that write it, as JSON lines, to DIR/audit.log. The log
// backend is blocking by default: an event is in the file when its response is sent.
func auditLog(dir string) ([]string, error) {
	policy := filepath.Join(dir, "audit-policy.yaml")
	text := "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n"
	if err := os.WriteFile(policy, []byte(text), 0o644); err != nil {
		return nil, fmt.Errorf("writing the audit policy: %w", err)
	}
	return []string{"--audit-policy-file=" + policy, "--audit-log-path=" + filepath.Join(dir, "audit.log")}, nil
}

// prepareDir makes DIR usable: a live control plane recorded in it is an error; the leftovers
// of a crashed or stopped one (pidfile, etcd data, certificates, kubeconfig) are removed.
func prepareDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if pid, ok := readPid(filepath.Join(dir, pidFileName)); ok && isControlPlane(pid) {
		return fmt.Errorf("a control plane is already running from %s (pid %d); stop it with `controlplane down --dir %s`", dir, pid, dir)
	}
	for _, name := range []string{pidFileName, "ready", "etcd", "pki", "kubeconfig", "etcd.log"} {
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("removing stale %s: %w", name, err)
		}
	}
	return nil
}

func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func waitReady(ctx context.Context, server string, c *pki, apiDone <-chan error) error {
	caPEM, err := os.ReadFile(c.caCert)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	clientCert, err := tls.LoadX509KeyPair(c.adminCert, c.adminKey)
	if err != nil {
		return err
	}
	client := &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: pool, Certificates: []tls.Certificate{clientCert}, MinVersion: tls.VersionTLS12,
		}},
	}
	last := "no answer yet"
	for {
		select {
		case err := <-apiDone:
			return fmt.Errorf("kube-apiserver exited before it was ready: %v", err)
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready in time (last /readyz: %s)", last)
		case <-time.After(300 * time.Millisecond):
		}
		resp, err := client.Get(server + "/readyz")
		if err != nil {
			last = err.Error()
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return nil
		}
		last = resp.Status
	}
}

// ---------------------------------------------------------------------------------------------
// status, down

func cmdStatus(args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	dir := fs.String("dir", "", "state directory given to up")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return errors.New("--dir is required")
	}
	pid, ok := readPid(filepath.Join(*dir, pidFileName))
	if !ok || !isControlPlane(pid) {
		return fmt.Errorf("not running (state directory %s)", *dir)
	}
	fmt.Println(pid)
	return nil
}

func cmdDown(args []string) error {
	fs := flag.NewFlagSet("down", flag.ContinueOnError)
	dir := fs.String("dir", "", "state directory given to up")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait before SIGKILL")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return errors.New("--dir is required")
	}
	pidFile := filepath.Join(*dir, pidFileName)
	pid, ok := readPid(pidFile)
	if !ok {
		fmt.Fprintf(os.Stderr, "controlplane down: nothing running (no %s)\n", pidFile)
		return nil
	}
	if !isControlPlane(pid) {
		fmt.Fprintf(os.Stderr, "controlplane down: pid %d is gone; removing stale %s\n", pid, pidFile)
		return os.Remove(pidFile)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	deadline := time.Now().Add(*timeout)
	for time.Now().Before(deadline) {
		if !isControlPlane(pid) { // gone (or a zombie waiting for its parent)
			os.Remove(pidFile)
			fmt.Fprintf(os.Stderr, "controlplane down: stopped pid %d\n", pid)
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	time.Sleep(500 * time.Millisecond)
	os.Remove(pidFile)
	fmt.Fprintf(os.Stderr, "controlplane down: pid %d did not stop in %s; killed it\n", pid, *timeout)
	return nil
}
