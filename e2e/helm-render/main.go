// helm-render renders a Helm chart the way `helm template` does, with Helm's own Go packages
// (chart loader, values coalescing and schema check, template engine, install ordering), for
// the e2e suite: no helm binary is needed to test deploy/helm/gpu-tenancy.
//
//	helm-render [--name RELEASE] [--namespace NS] [--kube-version V] [-f VALUES.yaml]... [--set k=v]... CHART_DIR
//
// Like `helm install`, it refuses a chart whose kubeVersion excludes --kube-version (default
// the project's Kubernetes version). Prints the rendered manifests as one YAML stream in Helm's install order, each document
// headed by `# Source: <template>`; NOTES.txt and empty documents are left out. Exit 1 on any
// error (load, values, schema, template), with Helm's message.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	"helm.sh/helm/v3/pkg/strvals"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "helm-render: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	var valueFiles, sets list
	name := flag.String("name", "gpu-tenancy", "release name")
	namespace := flag.String("namespace", "gpu-tenancy-system", "release namespace")
	kubeVersion := flag.String("kube-version", "v1.37.0", "Kubernetes version for .Capabilities and the chart's kubeVersion check")
	flag.Var(&valueFiles, "f", "values file (repeatable; later files win)")
	flag.Var(&sets, "set", "value as key=value, Helm's --set syntax (repeatable; wins over -f)")
	flag.Parse()
	if flag.NArg() != 1 {
		return fmt.Errorf("usage: helm-render [--name R] [--namespace NS] [--kube-version V] [-f VALUES]... [--set k=v]... CHART_DIR")
	}
	kv, err := chartutil.ParseKubeVersion(*kubeVersion)
	if err != nil {
		return fmt.Errorf("--kube-version: %w", err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = *kv

	chrt, err := loader.Load(flag.Arg(0))
	if err != nil {
		return fmt.Errorf("loading chart %s: %w", flag.Arg(0), err)
	}
	if c := chrt.Metadata.KubeVersion; c != "" && !chartutil.IsCompatibleRange(c, kv.String()) {
		return fmt.Errorf("chart requires kubeVersion %s, which is incompatible with Kubernetes %s", c, kv)
	}
	vals := map[string]interface{}{}
	for _, f := range valueFiles {
		v, err := chartutil.ReadValuesFile(f)
		if err != nil {
			return fmt.Errorf("reading values %s: %w", f, err)
		}
		vals = chartutil.CoalesceTables(v.AsMap(), vals)
	}
	for _, s := range sets {
		if err := strvals.ParseInto(s, vals); err != nil {
			return fmt.Errorf("--set %s: %w", s, err)
		}
	}
	if err := chartutil.ProcessDependenciesWithMerge(chrt, vals); err != nil {
		return fmt.Errorf("chart dependencies: %w", err)
	}
	opts := chartutil.ReleaseOptions{Name: *name, Namespace: *namespace, Revision: 1, IsInstall: true}
	// ToRenderValues coalesces the chart's values.yaml with vals and checks values.schema.json.
	top, err := chartutil.ToRenderValues(chrt, vals, opts, caps)
	if err != nil {
		return err
	}
	files, err := engine.Render(chrt, top)
	if err != nil {
		return err
	}
	for k := range files {
		if strings.HasSuffix(k, "NOTES.txt") {
			delete(files, k)
		}
	}
	hooks, manifests, err := releaseutil.SortManifests(files, caps.APIVersions, releaseutil.InstallOrder)
	if err != nil {
		return err
	}
	if len(hooks) > 0 {
		return fmt.Errorf("the chart has %d hooks; this renderer prints plain manifests only", len(hooks))
	}
	var out strings.Builder
	for _, m := range manifests {
		fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", m.Name, strings.TrimSpace(m.Content))
	}
	_, err = os.Stdout.WriteString(out.String())
	return err
}
