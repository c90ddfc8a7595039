package routes

import (
	"fmt"
	"io"
	"os"
	"syscall"
	"time"
)

// Bounds of a config read (R-L10).
const (
	// DefaultMaxConfigBytes is limits.max_config_bytes unset.
	DefaultMaxConfigBytes = 16 << 20
	// MaxMaxConfigBytes is the largest limits.max_config_bytes, and the
	// bound of the read at start, before the file's own limit is known.
	MaxMaxConfigBytes = 256 << 20
	// ConfigReadTimeout bounds one read of the config file: a file on a
	// stuck network mount must not hold the reloader (and, through it,
	// nothing else: R-L11) for ever.
	ConfigReadTimeout = 5 * time.Second
)

// ReadRefusedError is a config file fusebox will not read: not a regular
// file, or over the size limit.
type ReadRefusedError struct {
	Path, Why string
}

func (e *ReadRefusedError) Error() string {
	return fmt.Sprintf("config file %s refused: %s", e.Path, e.Why)
}

// readBounded reads a config file with the R-L10 bounds: a regular file
// only (a symlink is followed, and must end at one: a device such as
// /dev/zero or a FIFO is refused before it is opened), at most max bytes,
// within timeout. The open is non-blocking so that a FIFO swapped in
// between the check and the open cannot block it either.
func readBounded(path string, max int64, timeout time.Duration) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("reading config: %w", err)
	}
	if err := checkRegular(path, st, max); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("reading config: %w", err)
	}
	if st, err = f.Stat(); err != nil || checkRegular(path, st, max) != nil {
		f.Close()
		if err == nil {
			err = checkRegular(path, st, max)
		}
		return nil, err
	}
	type read struct {
		b   []byte
		err error
	}
	done := make(chan read, 1)
	go func() {
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, max+1))
		done <- read{b, err}
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, fmt.Errorf("reading config: %w", r.err)
		}
		if int64(len(r.b)) > max {
			// It grew while being read.
			return nil, &ReadRefusedError{Path: path, Why: fmt.Sprintf("over limits.max_config_bytes (%d bytes)", max)}
		}
		return r.b, nil
	case <-t.C:
		// The read goroutine ends (and closes the file) when the read
		// returns; one at a time, since the reloader is serialised.
		return nil, &ReadRefusedError{Path: path, Why: fmt.Sprintf("not read within %s", timeout)}
	}
}

func checkRegular(path string, st os.FileInfo, max int64) error {
	if !st.Mode().IsRegular() {
		return &ReadRefusedError{Path: path, Why: fmt.Sprintf("not a regular file (%s); devices, FIFOs and sockets are never read", st.Mode().Type())}
	}
	if st.Size() > max {
		return &ReadRefusedError{Path: path, Why: fmt.Sprintf("%d bytes, over limits.max_config_bytes (%d bytes)", st.Size(), max)}
	}
	return nil
}
