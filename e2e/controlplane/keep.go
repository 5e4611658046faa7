package main

// A restart that keeps the data: `up --keep` starts again on what an earlier `up` left in its
// directory (etcd data, certificates, ports), so clients holding the kubeconfig reconnect to the
// same address with the same credentials and find every object as it was, as after a control
// plane outage on a real cluster.

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

const portsFileName = "ports"

// savePorts records the ports an `up` listens on, for a later `up --keep`.
func savePorts(dir string, ports []int) error {
	words := make([]string, len(ports))
	for i, p := range ports {
		words[i] = strconv.Itoa(p)
	}
	return os.WriteFile(filepath.Join(dir, portsFileName), []byte(strings.Join(words, " ")+"\n"), 0o644)
}

// loadKept checks that DIR holds a stopped control plane's state and returns its certificates
// and ports (etcd client, etcd peer, API server). A live control plane there is an error.
func loadKept(dir string) (*pki, []int, error) {
	if pid, ok := readPid(filepath.Join(dir, pidFileName)); ok && isControlPlane(pid) {
		return nil, nil, fmt.Errorf("a control plane is still running from %s (pid %d); stop it with `controlplane down --dir %s` before `up --keep`", dir, pid, dir)
	}
	for _, name := range []string{pidFileName, "ready"} {
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			return nil, nil, fmt.Errorf("removing stale %s: %w", name, err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, portsFileName))
	if err != nil {
		return nil, nil, fmt.Errorf("--keep needs the state of an earlier `up --dir %s`: %w", dir, err)
	}
	var ports []int
	for _, w := range strings.Fields(string(b)) {
		p, err := strconv.Atoi(w)
		if err != nil || p <= 0 || p > 65535 {
			return nil, nil, fmt.Errorf("%s: %q is not a port; remove the directory and start without --keep", filepath.Join(dir, portsFileName), w)
		}
		ports = append(ports, p)
	}
	if len(ports) != 3 {
		return nil, nil, fmt.Errorf("%s: want 3 ports (etcd client, etcd peer, API server), found %d", filepath.Join(dir, portsFileName), len(ports))
	}
	pkiDir := filepath.Join(dir, "pki")
	p := &pki{
		caCert: filepath.Join(pkiDir, "ca.crt"), caKey: filepath.Join(pkiDir, "ca.key"),
		servingCert: filepath.Join(pkiDir, "apiserver.crt"), servingKey: filepath.Join(pkiDir, "apiserver.key"),
		adminCert: filepath.Join(pkiDir, "admin.crt"), adminKey: filepath.Join(pkiDir, "admin.key"),
		saKey: filepath.Join(pkiDir, "sa.key"), saPub: filepath.Join(pkiDir, "sa.pub"),
	}
	for _, f := range []string{p.caCert, p.servingCert, p.servingKey, p.adminCert, p.adminKey, p.saKey, p.saPub, filepath.Join(dir, "etcd")} {
		if _, err := os.Stat(f); err != nil {
			return nil, nil, fmt.Errorf("--keep: %w (the earlier state is incomplete; start without --keep)", err)
		}
	}
	return p, ports, nil
}
