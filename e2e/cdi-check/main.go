// Command cdi-check validates CDI (Container Device Interface) spec files the
// way container runtimes do: with the CDI project's own Go library, through
// the same pkg/cdi.ReadSpec that the library's spec cache (used by containerd,
// CRI-O and Podman) calls for every spec file it loads.
//
// Usage:
//
//	cdi-check [-lowest-version] [-require-device VENDOR/CLASS=NAME]... FILE...
//
// For each FILE it prints one line:
//
//	ok FILE: kind K, N devices: K=NAME...
//	invalid FILE: <the library's error>
//
// With -lowest-version a file is also invalid unless its cdiVersion is the lowest that
// expresses it (the library's own MinimumRequiredVersion): a runtime whose CDI library is older
// than the version a spec names refuses the spec, whatever it holds.
//
// It exits 1 if any file is invalid, if two files in the same directory define
// the same device (the runtime's cache drops such a device), or if a required
// device is defined by no valid file; 2 on usage errors.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// checkLowestVersion: with -lowest-version, a spec must name the lowest version that expresses it.
var checkLowestVersion bool

// requiredDevices collects the repeatable -require-device flag.
type requiredDevices []string

func (r *requiredDevices) String() string { return strings.Join(*r, ",") }

func (r *requiredDevices) Set(v string) error {
	if _, _, _, err := parser.ParseQualifiedName(v); err != nil {
		return err
	}
	*r = append(*r, v)
	return nil
}

// checkedSpec is what one valid spec file defines.
type checkedSpec struct {
	Kind string
	// Devices are the qualified names (VENDOR/CLASS=NAME), in file order.
	Devices []string
}

// checkFile reads, parses and validates one CDI spec file as a runtime's spec
// cache does, then checks that each of its devices' qualified names parses
// back, with the library's parser, to the spec's vendor, class and the
// device's name.
func checkFile(path string) (*checkedSpec, error) {
	// The cache only loads files named *.json or *.yaml (pkg/cdi scanSpecDirs);
	// any other file in a spec directory is skipped, never loaded.
	if ext := filepath.Ext(path); ext != ".json" && ext != ".yaml" {
		return nil, fmt.Errorf("not loaded by runtimes: a CDI spec file name must end in .json or .yaml, not %q", ext)
	}
	// ReadSpec is what the cache calls for each spec file: it decodes with
	// unknown fields refused (ParseSpec), runs the external schema validator
	// if one was set (runtimes set none), then validates cdiVersion, kind
	// (vendor and class names), annotations, the spec's containerEdits and
	// every device (name, annotations, non-empty and valid containerEdits, no
	// duplicate names, at least one device).
	spec, err := cdi.ReadSpec(path, 0)
	if err != nil {
		return nil, err
	}
	if checkLowestVersion {
		// On the spec as written: ReadSpec fills defaults in (a device node's hostPath) that
		// would raise the minimum.
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		raw, err := cdi.ParseSpec(data)
		if err != nil {
			return nil, err
		}
		lowest, err := cdispec.MinimumRequiredVersion(raw)
		if err != nil {
			return nil, err
		}
		if strings.TrimPrefix(spec.Version, "v") != lowest {
			return nil, fmt.Errorf("cdiVersion %q is not the lowest that expresses this spec (%q): runtimes with an older CDI library refuse it", spec.Version, lowest)
		}
	}
	out := &checkedSpec{Kind: spec.Kind}
	for _, d := range spec.Devices {
		dev := spec.GetDevice(d.Name)
		if dev == nil {
			return nil, fmt.Errorf("device %q not in the library's device table", d.Name)
		}
		qualified := dev.GetQualifiedName()
		vendor, class, name, err := parser.ParseQualifiedName(qualified)
		if err != nil {
			return nil, err
		}
		if vendor != spec.GetVendor() || class != spec.GetClass() || name != d.Name {
			return nil, fmt.Errorf("qualified device %q parses as vendor %q, class %q, name %q; the spec has vendor %q, class %q, name %q",
				qualified, vendor, class, name, spec.GetVendor(), spec.GetClass(), d.Name)
		}
		out.Devices = append(out.Devices, qualified)
	}
	return out, nil
}

// oneLine joins the lines of a multi-line error (the YAML decoder lists each
// unknown field on a line of its own) so that each file gets one output line.
func oneLine(err error) string {
	lines := strings.Split(err.Error(), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSpace(l)
	}
	return strings.Join(lines, " ")
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cdi-check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var required requiredDevices
	fs.BoolVar(&checkLowestVersion, "lowest-version", false, "fail a spec whose cdiVersion is not the lowest that expresses it")
	fs.Var(&required, "require-device", "fail unless some given file defines this qualified device `VENDOR/CLASS=NAME` (repeatable)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: cdi-check [-lowest-version] [-require-device VENDOR/CLASS=NAME]... FILE...\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}

	failed := false
	// definedBy maps a qualified device to the files that define it.
	definedBy := map[string][]string{}
	seen := map[string]bool{}
	for _, path := range fs.Args() {
		if seen[filepath.Clean(path)] {
			continue
		}
		seen[filepath.Clean(path)] = true
		spec, err := checkFile(path)
		if err != nil {
			fmt.Fprintf(stdout, "invalid %s: %s\n", path, oneLine(err))
			failed = true
			continue
		}
		fmt.Fprintf(stdout, "ok %s: kind %s, %d devices: %s\n", path, spec.Kind, len(spec.Devices), strings.Join(spec.Devices, " "))
		for _, q := range spec.Devices {
			definedBy[q] = append(definedBy[q], path)
		}
	}

	// The cache gives the files of one directory the same priority and drops a
	// device that two of them define ("conflicting device"); a device in files
	// of different directories goes to the higher-priority directory, which is
	// the runtime's configuration and no error.
	names := make([]string, 0, len(definedBy))
	for q := range definedBy {
		names = append(names, q)
	}
	sort.Strings(names)
	for _, q := range names {
		byDir := map[string][]string{}
		for _, p := range definedBy[q] {
			dir := filepath.Dir(filepath.Clean(p))
			byDir[dir] = append(byDir[dir], p)
		}
		for _, files := range byDir {
			if len(files) > 1 {
				fmt.Fprintf(stdout, "conflict %s: defined by %s (same directory: runtimes resolve neither)\n", q, strings.Join(files, ", "))
				failed = true
			}
		}
	}

	for _, q := range required {
		if len(definedBy[q]) == 0 {
			fmt.Fprintf(stdout, "missing %s: defined by no valid given spec file\n", q)
			failed = true
		}
	}

	if failed {
		return 1
	}
	return 0
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}
