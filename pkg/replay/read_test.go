package replay

import (
	"bytes"
	"strings"
	"testing"
)

// TestLongLinesAndJunkAreExplained (#37, R-R6..R-R7): a line over 1 MiB
// is skipped and the file read on (before, a line over 64 KiB stopped the
// file: a 200,001-line log replayed 10 lines); a line of up to 1 MiB is
// read; every malformed line is counted by reason, the first few named
// with file and line.
func TestLongLinesAndJunkAreExplained(t *testing.T) {
	good := synthetic(3, 10)
	lines := bytes.SplitAfter(good, []byte("\n"))
	// A line of 512 KiB (a long path in a custom format) is a line.
	big := bytes.Replace(lines[0], []byte(`"details":"via_upstream"`), []byte(`"details":"`+strings.Repeat("x", 512<<10)+`"`), 1)
	var raw bytes.Buffer
	raw.Write(big)
	raw.WriteString(`{"junk": "` + strings.Repeat("y", 2<<20) + `"}` + "\n") // over 1 MiB
	raw.WriteString("not json\n")
	raw.WriteString(`{"start_time":"-"}` + "\n")
	raw.Write(lines[1])
	raw.Write(lines[2])
	log := &Log{}
	if err := log.read("access.log", &raw); err != nil {
		t.Fatal(err)
	}
	if len(log.Lines) != 3 || log.Malformed != 3 {
		t.Fatalf("%d lines, %d malformed: %v", len(log.Lines), log.Malformed, log.Examples)
	}
	want := []string{
		"access.log:2: longer than 1 MiB",
		"access.log:3: not a JSON object",
		"access.log:4: no start_time in unix seconds",
	}
	for i, w := range want {
		if i >= len(log.Examples) || !strings.HasPrefix(log.Examples[i], w) {
			t.Errorf("example %d: %v, want %q", i, log.Examples, w)
		}
	}
	if log.Why["longer than 1 MiB"] != 1 {
		t.Fatalf("reasons %v", log.Why)
	}
}
