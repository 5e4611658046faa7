package main

// Argo CD resource health through Lua, run the way Argo CD runs it (argo-cd util/lua/lua.go,
// VM.runLua and VM.ExecuteHealthLua; its tests in util/lua/health_test.go):
//
//   - a fresh gopher-lua state per evaluation; with Argo CD's built-in scripts (and a
//     customization with `useOpenLibs: true`) the standard libraries are open, otherwise
//     (a `resource.customizations.health.<group>_<Kind>` entry without it) only package, base,
//     table and a "safe" os library are loaded. Our scripts must work in both, so every test
//     runs in both modes and both must give the expected result;
//   - a one second deadline on the state's context;
//   - the object becomes the global `obj`: maps become tables keyed by strings (RawSetH), lists
//     become array tables (Append), numbers (float64 from YAML test data, int64 from the live
//     cluster) become numbers, json.Number becomes a string, null becomes nil;
//   - the script's return value (top of the stack) must be a table; it is encoded to JSON and
//     decoded into {status, message}; an empty table is an empty health status; a status that
//     is not one of Argo CD's codes becomes Unknown with Argo CD's message.
//
// Argo CD's own module (and its gitops-engine) does not build with the Go and Kubernetes
// versions here, so this is a re-implementation of that behaviour on the same Lua VM
// (github.com/yuin/gopher-lua), not a call into Argo CD.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	ssautil "github.com/fluxcd/pkg/ssa/utils"
	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

// HealthStatus is Argo CD's health.HealthStatus as health_test.yaml spells it.
type HealthStatus struct {
	Status  string `json:"status,omitempty"`
	Message string `json:"message,omitempty"`
}

// Argo CD's health status codes (gitops-engine pkg/health).
var healthCodes = map[string]bool{
	"Unknown": true, "Progressing": true, "Suspended": true, "Healthy": true, "Degraded": true, "Missing": true,
}

const invalidHealthStatus = "Lua returned an invalid health status"

// executeHealthLua evaluates a health script on an object as Argo CD does.
func executeHealthLua(obj map[string]any, script string, openLibs bool) (*HealthStatus, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: !openLibs})
	defer l.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.OsLibName, openSafeOs},
	} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			return nil, fmt.Errorf("opening Lua library %s: %w", lib.name, err)
		}
	}
	l.PreloadModule(lua.OsLibName, safeOsLoader)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", toLua(l, obj))
	if err := l.DoString(script); err != nil {
		return nil, err
	}
	ret := l.Get(-1)
	switch ret.Type() {
	case lua.LTNil:
		return &HealthStatus{}, nil
	case lua.LTTable:
	default:
		return nil, fmt.Errorf("expect table output from Lua script, not %s", ret.Type())
	}
	v, err := fromLua(ret, 0)
	if err != nil {
		return nil, err
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	hs := &HealthStatus{}
	if err := json.Unmarshal(raw, hs); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Value == "array" {
			return &HealthStatus{}, nil // an empty table encodes as []
		}
		return nil, err
	}
	if !healthCodes[hs.Status] {
		return &HealthStatus{Status: "Unknown", Message: invalidHealthStatus}, nil
	}
	return hs, nil
}

// toLua converts a decoded JSON/YAML value into a Lua value.
func toLua(l *lua.LState, v any) lua.LValue {
	switch x := v.(type) {
	case bool:
		return lua.LBool(x)
	case float64:
		return lua.LNumber(x)
	case int:
		return lua.LNumber(x)
	case int32:
		return lua.LNumber(x)
	case int64:
		return lua.LNumber(x)
	case string:
		return lua.LString(x)
	case json.Number:
		return lua.LString(x)
	case []any:
		t := l.CreateTable(len(x), 0)
		for _, item := range x {
			t.Append(toLua(l, item))
		}
		return t
	case map[string]any:
		t := l.CreateTable(0, len(x))
		for k, item := range x {
			t.RawSetH(lua.LString(k), toLua(l, item))
		}
		return t
	}
	return lua.LNil
}

// fromLua converts a Lua value back for JSON encoding, as layeh.com/gopher-json (which Argo CD
// uses) does: a table with keys 1..n is an array, one with string keys an object, an empty
// table an empty array.
func fromLua(v lua.LValue, depth int) (any, error) {
	if depth > 100 {
		return nil, errors.New("Lua table nested too deeply (a cycle?)")
	}
	switch x := v.(type) {
	case lua.LBool:
		return bool(x), nil
	case lua.LNumber:
		f := float64(x)
		if math.IsInf(f, 0) || math.IsNaN(f) {
			return nil, fmt.Errorf("cannot encode number %v as JSON", f)
		}
		return f, nil
	case *lua.LNilType:
		return nil, nil
	case lua.LString:
		return string(x), nil
	case *lua.LTable:
		if x.MaxN() > 0 {
			arr := make([]any, 0, x.MaxN())
			for i := 1; i <= x.MaxN(); i++ {
				item, err := fromLua(x.RawGetInt(i), depth+1)
				if err != nil {
					return nil, err
				}
				arr = append(arr, item)
			}
			return arr, nil
		}
		obj := map[string]any{}
		var ferr error
		x.ForEach(func(k, val lua.LValue) {
			if ferr != nil {
				return
			}
			ks, ok := k.(lua.LString)
			if !ok {
				ferr = fmt.Errorf("cannot encode a Lua table with key of type %s", k.Type())
				return
			}
			item, err := fromLua(val, depth+1)
			if err != nil {
				ferr = err
				return
			}
			obj[string(ks)] = item
		})
		if ferr != nil {
			return nil, ferr
		}
		if len(obj) == 0 {
			return []any{}, nil
		}
		return obj, nil
	}
	return nil, fmt.Errorf("cannot encode Lua value of type %s", v.Type())
}

// openSafeOs and safeOsLoader give scripts what Argo CD's "safe" os library gives: time and
// date functions, nothing that touches the process or the file system.
func openSafeOs(l *lua.LState) int {
	mod := l.RegisterModule(lua.OsLibName, safeOsFuncs)
	l.Push(mod)
	return 1
}

func safeOsLoader(l *lua.LState) int {
	mod := l.SetFuncs(l.NewTable(), safeOsFuncs)
	l.Push(mod)
	return 1
}

var safeOsFuncs = map[string]lua.LGFunction{
	"time": func(l *lua.LState) int {
		if l.GetTop() == 0 || l.Get(1) == lua.LNil {
			l.Push(lua.LNumber(time.Now().Unix()))
			return 1
		}
		t := l.CheckTable(1)
		field := func(name string, def int) int {
			if n, ok := t.RawGetString(name).(lua.LNumber); ok {
				return int(n)
			}
			return def
		}
		ts := time.Date(field("year", 1970), time.Month(field("month", 1)), field("day", 1),
			field("hour", 12), field("min", 0), field("sec", 0), 0, time.Local)
		l.Push(lua.LNumber(ts.Unix()))
		return 1
	},
	"difftime": func(l *lua.LState) int {
		l.Push(lua.LNumber(l.CheckNumber(1) - l.OptNumber(2, 0)))
		return 1
	},
	"clock": func(l *lua.LState) int {
		l.Push(lua.LNumber(float64(time.Now().UnixNano()) / 1e9))
		return 1
	},
}

// scriptPath is where Argo CD looks for a kind's health script: <group>/<Kind>/health.lua
// (just <Kind>/ for the core group).
func scriptPath(root string, gvk schema.GroupVersionKind) string {
	if gvk.Group == "" {
		return filepath.Join(root, gvk.Kind, "health.lua")
	}
	return filepath.Join(root, gvk.Group, gvk.Kind, "health.lua")
}

type healthTestFile struct {
	Tests []struct {
		InputPath    string       `json:"inputPath"`
		HealthStatus HealthStatus `json:"healthStatus"`
	} `json:"tests"`
}

// cmdArgoHealthTest runs every health_test.yaml below DIR.
func cmdArgoHealthTest(args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintf(stderr, "usage: gitops argocd-health-test DIR\n")
		return exitUsage
	}
	root := args[0]
	var scripts []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && d.Name() == "health.lua" {
			scripts = append(scripts, path)
		}
		return nil
	})
	if err != nil {
		fmt.Fprintf(stderr, "gitops: %v\n", err)
		return exitUsage
	}
	if len(scripts) == 0 {
		fmt.Fprintf(stderr, "gitops: no health.lua under %s\n", root)
		return exitUsage
	}
	sort.Strings(scripts)
	passed, failed := 0, 0
	fail := func(format string, a ...any) {
		failed++
		fmt.Fprintf(stdout, "FAIL "+format+"\n", a...)
	}
	for _, script := range scripts {
		dir := filepath.Dir(script)
		rel, _ := filepath.Rel(root, dir)
		src, err := os.ReadFile(script)
		if err != nil {
			fail("%s: %v", rel, err)
			continue
		}
		raw, err := os.ReadFile(filepath.Join(dir, "health_test.yaml"))
		if err != nil {
			fail("%s: every health.lua needs a health_test.yaml: %v", rel, err)
			continue
		}
		var tf healthTestFile
		if err := yaml.UnmarshalStrict(raw, &tf); err != nil {
			fail("%s/health_test.yaml: %v", rel, err)
			continue
		}
		if len(tf.Tests) == 0 {
			fail("%s/health_test.yaml: no tests", rel)
			continue
		}
		used := map[string]bool{}
		for _, tc := range tf.Tests {
			name := filepath.ToSlash(filepath.Join(rel, tc.InputPath))
			used[filepath.Clean(tc.InputPath)] = true
			data, err := os.ReadFile(filepath.Join(dir, tc.InputPath))
			if err != nil {
				fail("%s: %v", name, err)
				continue
			}
			// As Argo CD's test: sigs.k8s.io/yaml into a map (numbers are float64).
			obj := map[string]any{}
			if err := yaml.Unmarshal(data, &obj); err != nil {
				fail("%s: %v", name, err)
				continue
			}
			// Argo CD finds the script by the object's group and kind: test data of another
			// kind would silently test nothing in Argo CD's layout.
			u := &unstructured.Unstructured{Object: obj}
			if want := scriptPath(root, u.GroupVersionKind()); filepath.Clean(want) != filepath.Clean(script) {
				fail("%s: a %s is judged by %s, not by %s", name, u.GroupVersionKind(), want, script)
				continue
			}
			ok := true
			for _, open := range []bool{true, false} {
				got, err := executeHealthLua(obj, string(src), open)
				mode := "open libraries"
				if !open {
					mode = "Argo CD's restricted libraries"
				}
				if err != nil {
					fail("%s (%s): %v", name, mode, err)
					ok = false
					break
				}
				if *got != tc.HealthStatus {
					fail("%s (%s): expected %s %q, got %s %q", name, mode,
						tc.HealthStatus.Status, tc.HealthStatus.Message, got.Status, got.Message)
					ok = false
					break
				}
			}
			if ok {
				passed++
				fmt.Fprintf(stdout, "ok   %s: %s %q\n", name, tc.HealthStatus.Status, tc.HealthStatus.Message)
			}
		}
		// Every test object is used: a file nobody checks is a case that silently stopped counting.
		entries, _ := os.ReadDir(filepath.Join(dir, "testdata"))
		for _, e := range entries {
			p := filepath.Join("testdata", e.Name())
			if !e.IsDir() && strings.HasSuffix(e.Name(), ".yaml") && !used[p] {
				fail("%s: %s is not used by health_test.yaml", rel, p)
			}
		}
	}
	fmt.Fprintf(stdout, "%d passed, %d failed\n", passed, failed)
	if failed > 0 {
		return 1
	}
	return 0
}

// readObjects reads objects from a file or stdin ("-"): YAML or JSON documents, Lists
// expanded (kubectl get -o json), with Flux's own reader; numbers stay integers.
func readObjects(path string, stdin io.Reader) ([]*unstructured.Unstructured, error) {
	var r io.Reader = stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	objs, err := ssautil.ReadObjects(r)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return objs, nil
}

type objectHealth struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	Namespace  string `json:"namespace,omitempty"`
	Status     string `json:"status"`
	Message    string `json:"message"`
}

// cmdArgoHealth prints the Argo CD health of every object in a file, by the scripts under --dir.
func cmdArgoHealth(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := "deploy/argocd"
	var files []string
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "--dir" && i+1 < len(args):
			root = args[i+1]
			i++
		case strings.HasPrefix(a, "--dir="):
			root = strings.TrimPrefix(a, "--dir=")
		default:
			files = append(files, a)
		}
	}
	if len(files) != 1 {
		fmt.Fprintf(stderr, "usage: gitops argocd-health [--dir DIR] FILE|-\n")
		return exitUsage
	}
	objs, err := readObjects(files[0], stdin)
	if err != nil {
		fmt.Fprintf(stderr, "gitops: %v\n", err)
		return exitUsage
	}
	out := make([]objectHealth, 0, len(objs))
	for _, u := range objs {
		path := scriptPath(root, u.GroupVersionKind())
		src, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintf(stderr, "gitops: no Argo CD health script for %s %s: %v\n", u.GroupVersionKind(), u.GetName(), err)
			return exitUsage
		}
		hs, err := executeHealthLua(u.Object, string(src), false)
		if err != nil {
			fmt.Fprintf(stderr, "gitops: %s on %s/%s: %v\n", path, u.GetKind(), u.GetName(), err)
			return 1
		}
		out = append(out, objectHealth{
			APIVersion: u.GetAPIVersion(), Kind: u.GetKind(), Name: u.GetName(), Namespace: u.GetNamespace(),
			Status: hs.Status, Message: hs.Message,
		})
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(stderr, "gitops: %v\n", err)
		return exitUsage
	}
	return 0
}
