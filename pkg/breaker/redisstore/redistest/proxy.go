package redistest

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a TCP proxy in front of a Redis that misbehaves on demand, as
// Redis in production does more often than it dies cleanly: it adds latency
// per direction, stalls (accepts and forwards nothing, holding every
// byte), blackholes (drops every byte), resets every connection in the
// middle of a reply, and cuts the pub/sub connections alone. Every Redis
// test can run through it: point the client at Addr.
type Proxy struct {
	Addr   string
	target string
	ln     net.Listener

	up, down atomic.Int64 // latency per direction, ns
	stalled  atomic.Bool
	blackhol atomic.Bool
	// delayed and held count the chunks the latency delayed and the
	// chunks a stall held: a test can tell that its fault met traffic.
	delayed, held atomic.Int64

	mu    sync.Mutex
	conns map[*proxied]struct{}
	wake  chan struct{} // closed when a stall or blackhole ends
}

type proxied struct {
	client, server net.Conn
	pubsub         atomic.Bool // the client subscribed on it
}

// NewProxy starts a proxy to target on a free loopback port; it stops at
// Close.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[*proxied]struct{}{}, wake: make(chan struct{})}
	go p.accept()
	return p, nil
}

// Proxy starts a fault proxy in front of s, closed at the end of the test.
func (s *Server) Proxy(t testing.TB) *Proxy {
	t.Helper()
	p, err := NewProxy(s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// Latency delays every byte by up (client to Redis) and down (Redis to
// client); 0 for none.
func (p *Proxy) Latency(up, down time.Duration) { p.up.Store(int64(up)); p.down.Store(int64(down)) }

// Stall makes the proxy hold every byte in both directions until Stall(false):
// connected, not answering (a fork, a failover, a slow network).
func (p *Proxy) Stall(on bool) { p.setFlag(&p.stalled, on) }

// Blackhole drops every byte until Blackhole(false): sent, never answered,
// never delivered.
func (p *Proxy) Blackhole(on bool) { p.setFlag(&p.blackhol, on) }

func (p *Proxy) setFlag(f *atomic.Bool, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f.Swap(on) && !on {
		close(p.wake)
		p.wake = make(chan struct{})
	}
}

// Delayed counts the chunks a latency set by Latency delayed, so far.
func (p *Proxy) Delayed() int64 { return p.delayed.Load() }

// Held counts the chunks a stall held, so far.
func (p *Proxy) Held() int64 { return p.held.Load() }

// Reset closes every connection at once (with RST), in the middle of
// whatever it carried.
func (p *Proxy) Reset() { p.cut(func(*proxied) bool { return true }) }

// CutPubSub closes only the connections that subscribed (the feed), leaving
// the command connections alone.
func (p *Proxy) CutPubSub() { p.cut(func(c *proxied) bool { return c.pubsub.Load() }) }

func (p *Proxy) cut(which func(*proxied) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if which(c) {
			if tc, ok := c.client.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // RST, not FIN
			}
			c.client.Close()
			c.server.Close()
			delete(p.conns, c)
		}
	}
}

// PipeBuffer is what each direction of a proxied connection reads into.
const PipeBuffer = 32 << 10

// Conns is how many connections the proxy holds open, each with two
// PipeBuffers.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops the proxy and every connection.
func (p *Proxy) Close() {
	p.ln.Close()
	p.Stall(false)
	p.Blackhole(false)
	p.Reset()
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		pc := &proxied{client: c, server: s}
		p.mu.Lock()
		p.conns[pc] = struct{}{}
		p.mu.Unlock()
		go p.pipe(pc, c, s, &p.up, true)
		go p.pipe(pc, s, c, &p.down, false)
	}
}

// pipe copies one direction, chunk by chunk, each chunk held for the
// direction's latency and while the proxy stalls, and dropped while it
// blackholes.
func (p *Proxy) pipe(pc *proxied, from, to net.Conn, latency *atomic.Int64, upstream bool) {
	defer func() {
		from.Close()
		to.Close()
		p.mu.Lock()
		delete(p.conns, pc) // a connection the client closed (a pool shrinking)
		p.mu.Unlock()
	}()
	buf := make([]byte, PipeBuffer)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			chunk := append([]byte(nil), buf[:n]...)
			if upstream && bytes.Contains(bytes.ToUpper(chunk), []byte("SUBSCRIBE")) {
				pc.pubsub.Store(true)
			}
			if d := time.Duration(latency.Load()); d > 0 {
				p.delayed.Add(1)
				time.Sleep(d)
			}
			if p.stalled.Load() {
				p.held.Add(1)
			}
			for p.stalled.Load() {
				p.mu.Lock()
				w := p.wake
				p.mu.Unlock()
				if !p.stalled.Load() {
					break
				}
				<-w
			}
			if !p.blackhol.Load() {
				if _, werr := to.Write(chunk); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return // EOF or a cut: the deferred closes end the other direction
		}
	}
}
