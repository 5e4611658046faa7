// Package nvmlcheck holds the simulated NVML library (e2e/nvml-sim) to NVIDIA's published
// outputs, read through NVIDIA's own client: go-nvml loads the library as the device plugin, GPU
// feature discovery and mig-parted load libnvidia-ml.so, and go-nvlib enumerates devices and MIG
// profiles the way those tools do. What the answers are compared with is never the simulator's
// tables: it is `nvidia-smi` text printed on real GPUs (operator/tests/data/nvidia-smi, each
// file naming its source), and figures quoted in NVIDIA's issue trackers, each cited where used.
package nvmlcheck

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// LgipRow is one profile of `nvidia-smi mig -lgip`: its first line (GPU, name, ID, instances,
// memory, P2P, SM, DEC, ENC) and, where the published text kept it, its second (CE, JPEG, OFA).
type LgipRow struct {
	GPU       int
	Name      string // without nvidia-smi's "MIG " prefix
	ID        int
	Free      int
	Total     int
	MemoryGiB string // as printed, e.g. "9.62"
	SM        int
	DEC       int
	ENC       int
	// HasDecoders: DEC and ENC are known (a whole first line); HasEngines: the second line was kept.
	HasDecoders bool
	HasEngines  bool
	CE          int
	JPEG        int
	OFA         int
}

func cells(line string) []string {
	return strings.Fields(strings.Trim(strings.TrimSpace(line), "|"))
}

func atoi(s string) (int, error) {
	return strconv.Atoi(s)
}

// ParseLgip reads the profile rows of an `nvidia-smi mig -lgip` table. Lines starting with `#`
// are comments; borders and headers are skipped.
func ParseLgip(text string) ([]LgipRow, error) {
	var rows []LgipRow
	lines := strings.Split(text, "\n")
	for i, line := range lines {
		if strings.HasPrefix(line, "#") {
			continue
		}
		c := cells(line)
		if len(c) != 10 || c[1] != "MIG" {
			continue
		}
		var r LgipRow
		var err error
		num := func(s string) int {
			v, e := atoi(s)
			if e != nil && err == nil {
				err = fmt.Errorf("not a number %q in %q", s, line)
			}
			return v
		}
		free, total, ok := strings.Cut(c[4], "/")
		if !ok {
			return nil, fmt.Errorf("no Free/Total in %q", line)
		}
		r = LgipRow{
			GPU: num(c[0]), Name: c[2], ID: num(c[3]), Free: num(free), Total: num(total),
			MemoryGiB: c[5], SM: num(c[7]), DEC: num(c[8]), ENC: num(c[9]), HasDecoders: true,
		}
		if i+1 < len(lines) {
			if next := cells(lines[i+1]); len(next) == 3 {
				r.HasEngines = true
				r.CE, r.JPEG, r.OFA = num(next[0]), num(next[1]), num(next[2])
			}
		}
		if err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// LgippRow is one line of `nvidia-smi mig -lgipp`:
// `GPU  0 Profile ID 15 Placements: {0,2,4,6}:2` (`Placement : {0}:8` when there is one).
type LgippRow struct {
	GPU    int
	ID     int
	Starts []int
	Size   int
}

// ParseLgipp reads every line of an `nvidia-smi mig -lgipp` output.
func ParseLgipp(text string) ([]LgippRow, error) {
	var rows []LgippRow
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
			continue
		}
		bad := fmt.Errorf("not an `nvidia-smi mig -lgipp` line: %q", line)
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "GPU")
		if !ok {
			return nil, bad
		}
		gpu, rest, ok1 := strings.Cut(rest, "Profile ID")
		id, rest, ok2 := strings.Cut(rest, "Placement")
		_, set, ok3 := strings.Cut(rest, ":")
		starts, size, ok4 := strings.Cut(strings.TrimPrefix(strings.TrimSpace(set), "{"), "}:")
		if !ok1 || !ok2 || !ok3 || !ok4 {
			return nil, bad
		}
		r := LgippRow{}
		var err error
		if r.GPU, err = atoi(strings.TrimSpace(gpu)); err != nil {
			return nil, bad
		}
		if r.ID, err = atoi(strings.TrimSpace(id)); err != nil {
			return nil, bad
		}
		if r.Size, err = atoi(strings.TrimSpace(size)); err != nil {
			return nil, bad
		}
		for _, s := range strings.Split(starts, ",") {
			v, err := atoi(strings.TrimSpace(s))
			if err != nil {
				return nil, bad
			}
			r.Starts = append(r.Starts, v)
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// DataDir is where the repository keeps NVIDIA's own outputs, relative to this package.
const DataDir = "../../operator/tests/data/nvidia-smi"

// ReadData reads one file of DataDir.
func ReadData(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(DataDir, name))
	return string(b), err
}

// Published is what NVIDIA printed for one GPU model, and where it was printed.
type Published struct {
	Model  string // for messages
	Source string
	// Rows: the profiles nvidia-smi listed (a whole table when Complete).
	Rows     []LgipRow
	Complete bool
	// Placements from `nvidia-smi mig -lgipp`, when published.
	Placements []LgippRow
	// MemoryChecked: the memory column is held to the driver the simulator stands for (an older
	// driver printed other figures for the same part, see A100-80GB below).
	MemoryChecked bool
}

// FromFiles reads a published -lgip (and -lgipp) output of DataDir.
func FromFiles(model, lgip, lgipp string, complete bool) (Published, error) {
	p := Published{Model: model, Source: lgip, Complete: complete, MemoryChecked: true}
	text, err := ReadData(lgip)
	if err != nil {
		return p, err
	}
	if p.Rows, err = ParseLgip(text); err != nil {
		return p, err
	}
	if lgipp != "" {
		text, err := ReadData(lgipp)
		if err != nil {
			return p, err
		}
		if p.Placements, err = ParseLgipp(text); err != nil {
			return p, err
		}
	}
	return p, nil
}

// H10080GB is the H100 80GB HBM3 row of docs/nvidia.md#mig-geometry (the MIG user guide's H100 table and a
// published `nvidia-smi mig -lgip` of an H100 80GB: names, IDs, instances, GiB and SMs).
var H10080GB = Published{
	Model:  "H100-80GB",
	Source: "docs/nvidia.md#mig-geometry (MIG user guide, H100 80GB)",
	Rows: []LgipRow{
		{Name: "1g.10gb", ID: 19, Total: 7, MemoryGiB: "9.75", SM: 16},
		{Name: "1g.10gb+me", ID: 20, Total: 1, MemoryGiB: "9.75", SM: 16},
		{Name: "1g.20gb", ID: 15, Total: 4, MemoryGiB: "19.62", SM: 26},
		{Name: "2g.20gb", ID: 14, Total: 3, MemoryGiB: "19.62", SM: 32},
		{Name: "3g.40gb", ID: 9, Total: 2, MemoryGiB: "39.50", SM: 60},
		{Name: "4g.40gb", ID: 5, Total: 1, MemoryGiB: "39.50", SM: 64},
		{Name: "7g.80gb", ID: 0, Total: 1, MemoryGiB: "79.25", SM: 132},
	},
	Complete:      true,
	MemoryChecked: true,
}

// A10080GB is what NVIDIA/mig-parted#97 printed for an A100 80GB (`nvidia-smi mig -lgip`, its
// first four rows). Its driver printed 9.50 GiB for 1g.10gb where docs/nvidia.md#mig-geometry has 9856 MB, so the
// memory column is not held to it; names, IDs, instances and engines are.
var A10080GB = Published{
	Model:  "A100-80GB",
	Source: "NVIDIA/mig-parted#97",
	Rows: []LgipRow{
		{Name: "1g.10gb", ID: 19, Total: 7, SM: 14, DEC: 0, ENC: 0, HasDecoders: true, HasEngines: true, CE: 1},
		{Name: "1g.10gb+me", ID: 20, Total: 1, SM: 14, DEC: 1, ENC: 0, HasDecoders: true, HasEngines: true, CE: 1, JPEG: 1, OFA: 1},
		{Name: "2g.20gb", ID: 14, Total: 3, SM: 28, DEC: 1, ENC: 0, HasDecoders: true, HasEngines: true, CE: 2},
		{Name: "3g.40gb", ID: 9, Total: 2, SM: 42, DEC: 2, ENC: 0, HasDecoders: true, HasEngines: true, CE: 3},
	},
}
