// Command gitops checks gpu-tenancy's objects with the GitOps tools' own machinery, so the e2e
// suite proves what Argo CD and Flux users will see rather than what we think they will see:
//
//	gitops argocd-health-test DIR       run every health_test.yaml under DIR (Argo CD's
//	                                    resource_customizations layout) the way Argo CD's own
//	                                    TestLuaHealthScript does; exit 1 on any mismatch
//	gitops argocd-health [--dir DIR] FILE|-
//	                                    Argo CD health of live objects (a kubectl `-o json` List,
//	                                    one object, or a YAML stream) as a JSON list
//	gitops kstatus FILE|-               kstatus (sigs.k8s.io/cli-utils status.Compute) of each
//	                                    object in a file, one JSON line each; no cluster
//	gitops flux-apply-wait --kubeconfig K [--timeout 60s] [--interval 5s] [--fail-fast] FILES...
//	                                    apply with Flux's ResourceManager (fluxcd/pkg/ssa,
//	                                    ApplyAllStaged, field manager kustomize-controller) and wait
//	                                    with its kstatus poller (WaitForSetWithContext) until every
//	                                    object is Current; one JSON line per object; exit 0 all
//	                                    Current, 1 some Failed, 2 timeout
//
// Exit code 3 is a usage or I/O error (any subcommand).
package main

import (
	"fmt"
	"io"
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "argocd-health-test":
		return cmdArgoHealthTest(args[1:], stdout, stderr)
	case "argocd-health":
		return cmdArgoHealth(args[1:], stdin, stdout, stderr)
	case "kstatus":
		return cmdKstatus(args[1:], stdin, stdout, stderr)
	case "flux-apply-wait":
		return cmdFluxApplyWait(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "gitops: unknown command %q\n%s", args[0], usage)
		return exitUsage
	}
}
