package replay

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"container/heap"
	"errors"
	"fmt"
	"io"
	"os"
)

// Source is what Run replays: every line in time order, once per Each.
type Source interface {
	Each(fn func(*Line)) error
	// Counts reports what the last Each read: lines, and the malformed
	// ones (with reasons and the first few examples).
	Counts() (lines, malformed int, why map[string]int, examples []string)
}

// Each implements Source over lines held in memory.
func (l *Log) Each(fn func(*Line)) error {
	for i := range l.Lines {
		fn(&l.Lines[i])
	}
	return nil
}

// Counts implements Source.
func (l *Log) Counts() (int, int, map[string]int, []string) {
	return len(l.Lines), l.Malformed, l.Why, l.Examples
}

// Files is a Source read from files as it replays (R-R6): memory does not
// grow with the log. Access logs are written at each request's end, so a
// file is nearly in start order; each file's lines go through a bounded
// reorder window (a heap of reorderLines lines in all), and the files are
// merged by time. A line older than one already replayed (a request that
// ran longer than the window holds) is replayed at that later time, and
// counted in OutOfOrder. Before, every line of every file was held (a
// 5 MB gzip took 3.09 GB).
type Files struct {
	Paths []string
	// Window is the reorder window, in lines over all files (0:
	// reorderLines, 65,536, about 20 MiB of lines).
	Window int
	// What the last Each read.
	Lines, Malformed, OutOfOrder int
	Why                          map[string]int
	Examples                     []string
	First, Last                  int64 // the first and last line's time, unix ns
}

// reorderLines bounds the lines held for reordering, over all files.
const reorderLines = 1 << 16

// Counts implements Source.
func (f *Files) Counts() (int, int, map[string]int, []string) {
	return f.Lines, f.Malformed, f.Why, f.Examples
}

// Each implements Source: one pass over the files.
func (f *Files) Each(fn func(*Line)) error {
	*f = Files{Paths: f.Paths, Window: f.Window}
	log := &Log{} // the malformed lines' counts
	total := f.Window
	if total <= 0 {
		total = reorderLines
	}
	window := max(256, total/max(1, len(f.Paths)))
	var files []*fileStream
	defer func() {
		for _, fs := range files {
			fs.close()
		}
	}()
	for _, p := range f.Paths {
		fs, err := openStream(p, window, log)
		if err != nil {
			return err
		}
		files = append(files, fs)
	}
	m := &merge{}
	for _, fs := range files {
		if l, ok, err := fs.next(); err != nil {
			return err
		} else if ok {
			heap.Push(m, head{l, fs})
		}
	}
	last := int64(-1 << 63)
	for m.Len() > 0 {
		h := heap.Pop(m).(head)
		l := h.line
		if l.At < last {
			l.At = last
			f.OutOfOrder++
		}
		last = l.At
		if f.Lines == 0 {
			f.First = l.At
		}
		f.Last = l.At
		f.Lines++
		fn(&l)
		if nl, ok, err := h.fs.next(); err != nil {
			return err
		} else if ok {
			heap.Push(m, head{nl, h.fs})
		}
	}
	f.Malformed, f.Why, f.Examples = log.Malformed, log.Why, log.Examples
	return nil
}

// fileStream reads one file's lines through a reorder window.
type fileStream struct {
	name   string
	f      *os.File
	gz     *gzip.Reader
	br     *bufio.Reader
	log    *Log
	window int
	held   lineHeap
	n      int // the file's line number
	buf    []byte
	eof    bool
}

func openStream(path string, window int, log *Log) (*fileStream, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err // *PathError: names the file
	}
	fs := &fileStream{name: path, f: f, log: log, window: window, br: bufio.NewReaderSize(f, 64<<10)}
	if head, err := fs.br.Peek(2); err == nil && bytes.Equal(head, []byte{0x1f, 0x8b}) {
		gz, err := gzip.NewReader(fs.br)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: not a readable gzip file: %w", path, err)
		}
		fs.gz, fs.br = gz, bufio.NewReaderSize(gz, 64<<10)
	}
	return fs, nil
}

func (fs *fileStream) close() {
	if fs.gz != nil {
		fs.gz.Close()
	}
	fs.f.Close()
}

// next is the file's earliest held line once the window is full (or the
// file ended).
func (fs *fileStream) next() (Line, bool, error) {
	for !fs.eof && fs.held.Len() < fs.window {
		if err := fs.readOne(); err != nil {
			return Line{}, false, err
		}
	}
	if fs.held.Len() == 0 {
		return Line{}, false, nil
	}
	return fs.held.pop(), true, nil
}

func (fs *fileStream) readOne() error {
	fs.n++
	b, tooLong, err := readLine(fs.br, fs.buf[:0])
	fs.buf = b[:0]
	if err != nil && err != io.EOF {
		// Which file, and where: a truncated gzip said only
		// "unexpected EOF" (#54).
		if errors.Is(err, io.ErrUnexpectedEOF) && fs.gz != nil {
			return fmt.Errorf("%s: line %d: the gzip stream ends early (a truncated file?): %w", fs.name, fs.n, err)
		}
		return fmt.Errorf("%s: line %d: %w", fs.name, fs.n, err)
	}
	if err == io.EOF {
		fs.eof = true
	}
	if line, ok := fs.log.parse(fs.name, fs.n, b, tooLong); ok {
		fs.held.push(&line)
	}
	return nil
}

// lineHeap holds a file's window of lines in the order they will be
// replayed: by time, then by the order they were read (a heap alone is not
// stable, and lines of one millisecond must keep their order). The lines
// stay in a slab; the heap moves small entries without pointers, so that
// sifting neither copies lines nor runs the collector's write barriers
// (they were a third of replay's time).
type lineHeap struct {
	lines []Line
	free  []int32
	h     []heldLine
	seq   uint64
}

type heldLine struct {
	at   int64
	seq  uint64
	slot int32
}

func (a heldLine) before(b heldLine) bool {
	return a.at < b.at || a.at == b.at && a.seq < b.seq
}

func (h *lineHeap) Len() int { return len(h.h) }

func (h *lineHeap) push(l *Line) {
	var slot int32
	if n := len(h.free); n > 0 {
		slot, h.free = h.free[n-1], h.free[:n-1]
		h.lines[slot] = *l
	} else {
		slot = int32(len(h.lines))
		h.lines = append(h.lines, *l)
	}
	h.seq++
	h.h = append(h.h, heldLine{at: l.At, seq: h.seq, slot: slot})
	for i := len(h.h) - 1; i > 0; {
		p := (i - 1) / 2
		if !h.h[i].before(h.h[p]) {
			break
		}
		h.h[i], h.h[p] = h.h[p], h.h[i]
		i = p
	}
}

// pop takes the earliest line out.
func (h *lineHeap) pop() Line {
	top := h.h[0]
	n := len(h.h) - 1
	h.h[0] = h.h[n]
	h.h = h.h[:n]
	for i := 0; ; {
		c := 2*i + 1
		if c >= n {
			break
		}
		if c+1 < n && h.h[c+1].before(h.h[c]) {
			c++
		}
		if !h.h[c].before(h.h[i]) {
			break
		}
		h.h[i], h.h[c] = h.h[c], h.h[i]
		i = c
	}
	l := h.lines[top.slot]
	h.lines[top.slot] = Line{} // the strings are garbage once replayed
	h.free = append(h.free, top.slot)
	return l
}

// merge orders the files' heads by time (ties: the file listed first).
type head struct {
	line Line
	fs   *fileStream
}

type merge []head

func (m merge) Len() int           { return len(m) }
func (m merge) Less(i, j int) bool { return m[i].line.At < m[j].line.At }
func (m merge) Swap(i, j int)      { m[i], m[j] = m[j], m[i] }
func (m *merge) Push(x any)        { *m = append(*m, x.(head)) }
func (m *merge) Pop() any {
	old := *m
	x := old[len(old)-1]
	*m = old[:len(old)-1]
	return x
}
