package main

import (
	"encoding/json"
	"fmt"
	"io"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

// objectStatus is one JSON line of `kstatus` and `flux-apply-wait`.
type objectStatus struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	Namespace  string `json:"namespace,omitempty"`
	// Status is kstatus's: Current, InProgress, Failed, Terminating, NotFound or Unknown.
	Status  string `json:"status"`
	Message string `json:"message"`
	// Source names the file of the object (kstatus) or "cluster" (flux-apply-wait).
	Source string `json:"source,omitempty"`
}

// compute is kstatus's status.Compute. Flux's poller (github.com/fluxcd/cli-utils, what
// fluxcd/pkg/ssa waits with) carries a copy of the same package; the two differ only in import
// paths at the versions pinned in go.mod.
func compute(u *unstructured.Unstructured) objectStatus {
	s := objectStatus{APIVersion: u.GetAPIVersion(), Kind: u.GetKind(), Name: u.GetName(), Namespace: u.GetNamespace()}
	res, err := status.Compute(u)
	if err != nil {
		s.Status, s.Message = status.UnknownStatus.String(), err.Error()
		return s
	}
	s.Status, s.Message = res.Status.String(), res.Message
	return s
}

// cmdKstatus prints status.Compute of each object in each file, one JSON line each.
func cmdKstatus(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintf(stderr, "usage: gitops kstatus FILE|-...\n")
		return exitUsage
	}
	enc := json.NewEncoder(stdout)
	for _, file := range args {
		objs, err := readObjects(file, stdin)
		if err != nil {
			fmt.Fprintf(stderr, "gitops: %v\n", err)
			return exitUsage
		}
		for _, u := range objs {
			s := compute(u)
			s.Source = file
			if err := enc.Encode(s); err != nil {
				fmt.Fprintf(stderr, "gitops: %v\n", err)
				return exitUsage
			}
		}
	}
	return 0
}
