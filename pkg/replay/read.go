package replay

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
)

// Log is what the files held.
type Log struct {
	Lines     []Line
	Malformed int // lines that were not access log lines: counted, skipped
	// Why counts the malformed lines by reason; Examples names the first
	// few (file:line: reason), so an operator can look.
	Why      map[string]int
	Examples []string
}

// maxExamples is how many malformed lines a report names.
const maxExamples = 5

func (l *Log) malformed(file string, n int, why string) {
	l.Malformed++
	if l.Why == nil {
		l.Why = map[string]int{}
	}
	l.Why[why]++
	if len(l.Examples) < maxExamples {
		l.Examples = append(l.Examples, fmt.Sprintf("%s:%d: %s", file, n, why))
	}
}

// ReadFiles reads every path (plain or gzip, told by its magic bytes) and
// returns the lines in time order (stable: the files' order breaks ties).
func ReadFiles(paths ...string) (*Log, error) {
	out := &Log{}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		err = out.read(p, f)
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	out.sort()
	return out, nil
}

func (l *Log) sort() {
	sort.SliceStable(l.Lines, func(i, j int) bool { return l.Lines[i].At < l.Lines[j].At })
}

func (l *Log) read(name string, r io.Reader) error {
	br := bufio.NewReaderSize(r, 64<<10)
	if head, err := br.Peek(2); err == nil && bytes.Equal(head, []byte{0x1f, 0x8b}) {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return err
		}
		defer gz.Close()
		br = bufio.NewReaderSize(gz, 64<<10)
	}
	var buf []byte
	for n := 1; ; n++ {
		b, tooLong, err := readLine(br, buf[:0])
		buf = b[:0]
		if err != nil && err != io.EOF {
			return err
		}
		if line, ok := l.parse(name, n, b, tooLong); ok {
			l.Lines = append(l.Lines, line)
		}
		if err == io.EOF {
			return nil
		}
	}
}

// parse reads line n of file name; a line that is not an access log line
// is counted with its reason (blank lines are nothing).
func (l *Log) parse(name string, n int, b []byte, tooLong bool) (Line, bool) {
	switch {
	case tooLong:
		l.malformed(name, n, "longer than 1 MiB")
	case len(bytes.TrimSpace(b)) > 0:
		line, err := ParseLine(b)
		if err == nil {
			return line, true
		}
		why := "not an access log line"
		var le *LineError
		if errors.As(err, &le) {
			why = le.Why
		}
		l.malformed(name, n, why)
	}
	return Line{}, false
}

// readLine reads one line into buf: at most maxLineBytes of it are kept; a
// longer one is read to its end and reported too long (before, a line over
// 64 KiB stopped the whole file: a 200,001-line log replayed 10 lines).
func readLine(br *bufio.Reader, buf []byte) ([]byte, bool, error) {
	tooLong := false
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(buf)+len(chunk) > maxLineBytes+1 {
				tooLong, buf = true, buf[:0]
			} else {
				buf = append(buf, chunk...)
			}
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		return buf, tooLong, err
	}
}
