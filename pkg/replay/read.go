package replay

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"sort"
)

// Log is what the files held.
type Log struct {
	Lines     []Line
	Malformed int // lines that were not access log lines: counted, skipped
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
		err = out.read(f)
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

func (l *Log) read(r io.Reader) error {
	br := bufio.NewReaderSize(r, 1<<20)
	if head, err := br.Peek(2); err == nil && bytes.Equal(head, []byte{0x1f, 0x8b}) {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return err
		}
		defer gz.Close()
		br = bufio.NewReaderSize(gz, 1<<20)
	}
	sc := bufio.NewScanner(br)
	sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes+1)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		line, err := ParseLine(sc.Bytes())
		if err != nil {
			l.Malformed++
			continue
		}
		l.Lines = append(l.Lines, line)
	}
	if err := sc.Err(); err == bufio.ErrTooLong {
		l.Malformed++ // one giant line: counted, and the rest of the file is lost with it
		return nil
	} else if err != nil {
		return err
	}
	return nil
}
