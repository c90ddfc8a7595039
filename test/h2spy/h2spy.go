package h2spy

import (
	"io"
	"net"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http2"
)

// Spy is a listener whose connections are forwarded to one address.
type Spy struct {
	ln      net.Listener
	to      string
	pings   atomic.Int64
	window  atomic.Int64
	connWin atomic.Int64
	conns   atomic.Int64
	readers sync.WaitGroup
}

// Listen starts a spy on a loopback port that forwards to addr.
func Listen(addr string) (*Spy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Spy{ln: ln, to: addr}
	go s.accept()
	return s, nil
}

// Addr is where clients connect.
func (s *Spy) Addr() string { return s.ln.Addr().String() }

// Pings is the number of PING frames (not acks) the clients sent.
func (s *Spy) Pings() int64 { return s.pings.Load() }

// Window is the last SETTINGS_INITIAL_WINDOW_SIZE a client sent (0: none).
func (s *Spy) Window() int64 { return s.window.Load() }

// ConnWindow is the connection window the last client opened: 65,535
// plus its first WINDOW_UPDATE on stream 0 (0: none came).
func (s *Spy) ConnWindow() int64 { return s.connWin.Load() }

// Conns is the number of connections forwarded.
func (s *Spy) Conns() int64 { return s.conns.Load() }

// Close stops accepting, and waits for the frames of the connections
// that ended to be read.
func (s *Spy) Close() {
	s.ln.Close()
	s.readers.Wait()
}

func (s *Spy) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", s.to)
		if err != nil {
			c.Close()
			continue
		}
		s.conns.Add(1)
		s.readers.Add(1)
		go func() { _, _ = io.Copy(c, u); c.Close() }()
		pr, pw := io.Pipe()
		go s.read(pr)
		go func() {
			_, _ = io.Copy(u, io.TeeReader(c, pw))
			pw.Close()
			u.Close()
		}()
	}
}

// read counts the client's frames until its connection ends.
func (s *Spy) read(r *io.PipeReader) {
	defer s.readers.Done()
	defer func() { _, _ = io.Copy(io.Discard, r) }()
	pre := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(r, pre); err != nil {
		return
	}
	fr := http2.NewFramer(nil, r)
	firstUpdate := true
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.PingFrame:
			if !f.IsAck() {
				s.pings.Add(1)
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 && firstUpdate {
				firstUpdate = false
				s.connWin.Store(65535 + int64(f.Increment))
			}
		case *http2.SettingsFrame:
			if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
				s.window.Store(int64(v))
			}
		}
	}
}
