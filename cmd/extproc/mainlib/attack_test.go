package mainlib

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The attack kit (#50): each of the classic HTTP/2 attacks of the issue
// runs against the built binary on both of its gRPC transports, with a
// legitimate client on a connection of its own that calls every 10 ms
// throughout. Each holds that the process lives, the legitimate client is
// answered every time (within 2 s: the failures measured were stalls of
// 100 s and refusals), and the process's resident memory stays within the
// attack's bound. Where grpc-go's server has no bound to give, that is
// listed (attackUnbounded) and its figure logged.

// attackUnbounded: attacks whose memory grpc-go's server does not bound.
var attackUnbounded = map[string]string{
	"unfinished large messages": "grpc-go's server has no budget across streams for messages still arriving; grpcwire charges each to a 256 MiB budget on its length prefix",
}

var attackBinary struct {
	once sync.Once
	path string
	err  error
}

func builtBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	attackBinary.once.Do(func() {
		dir, err := os.MkdirTemp("", "fusebox-attack")
		if err != nil {
			attackBinary.err = err
			return
		}
		attackBinary.path = filepath.Join(dir, "extproc")
		if out, err := exec.Command("go", "build", "-o", attackBinary.path, "github.com/fusebox-llm/fusebox/cmd/extproc").CombinedOutput(); err != nil {
			attackBinary.err = fmt.Errorf("build: %v\n%s", err, out)
		}
	})
	if attackBinary.err != nil {
		t.Fatal(attackBinary.err)
	}
	return attackBinary.path
}

type target struct {
	cmd  *exec.Cmd
	addr string
}

// rssMiB is the process's resident memory.
func (tg *target) rssMiB() float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", tg.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return float64(kb) / 1024
		}
	}
	return 0
}

func (tg *target) alive() bool {
	return tg.cmd.ProcessState == nil && tg.cmd.Process.Signal(unix.Signal(0)) == nil
}

func startTarget(t *testing.T, server string) *target {
	t.Helper()
	bin := builtBinary(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, "-grpc-addr", addr, "-admin-addr", "127.0.0.1:0", "-grpc-server", server, "-log-level", "error")
	cmd.Stderr = &syncBuffer{}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fusebox did not listen: %s", cmd.Stderr)
		}
	}
	return &target{cmd: cmd, addr: addr}
}

// legit calls grpc.health.v1 every 10 ms on its own connection until
// stopped, and reports its failures and its slowest answer.
type legit struct {
	stop     chan struct{}
	done     chan struct{}
	calls    atomic.Int64
	failures atomic.Int64
	slowest  atomic.Int64
	lastErr  atomic.Value
}

func startLegit(t *testing.T, addr string) *legit {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	hc := healthpb.NewHealthClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil { // connected before the attack
		t.Fatal(err)
	}
	l := &legit{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		defer cc.Close()
		for {
			select {
			case <-l.stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			t0 := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
			cancel()
			l.calls.Add(1)
			if err != nil {
				l.failures.Add(1)
				l.lastErr.Store(err.Error())
			}
			if d := int64(time.Since(t0)); d > l.slowest.Load() {
				l.slowest.Store(d)
			}
		}
	}()
	return l
}

func (l *legit) finish() { close(l.stop); <-l.done }

// rawConn is an attacker's HTTP/2 connection.
type rawConn struct {
	c    net.Conn
	fr   *http2.Framer
	hbuf bytes.Buffer
	henc *hpack.Encoder
	mu   sync.Mutex
	// The server's windows for what the attacker sends (drain keeps
	// them), so that an attack that honours flow control can: guarded by
	// mu, waited on with win.
	win                 *sync.Cond
	connWin, initialWin int64
	streamWin           map[uint32]int64
	dead                bool
}

// send writes b on stream id within the server's windows, waiting for its
// WINDOW_UPDATEs; false once the connection is gone.
func (r *rawConn) send(id uint32, b []byte) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.streamWin[id]; !ok {
		r.streamWin[id] = r.initialWin
	}
	n := int64(len(b))
	for !r.dead && (r.connWin < n || r.streamWin[id] < n) {
		r.win.Wait()
	}
	if r.dead {
		return false
	}
	r.connWin -= n
	r.streamWin[id] -= n
	return r.fr.WriteData(id, false, b) == nil
}

func dialAttack(t *testing.T, addr string, rcvbuf int) *rawConn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		if rcvbuf == 0 {
			return nil
		}
		var serr error
		err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, rcvbuf) })
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := &rawConn{c: c, fr: http2.NewFramer(c, c), connWin: 65535, initialWin: 65535, streamWin: map[uint32]int64{}}
	r.win = sync.NewCond(&r.mu)
	r.henc = hpack.NewEncoder(&r.hbuf)
	r.fr.SetMaxReadFrameSize(1 << 24)
	_, _ = c.Write([]byte(http2.ClientPreface))
	_ = r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30 >> 1})
	return r
}

const attackPath = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"

// open opens stream id with the gRPC request headers and extra fields.
func (r *rawConn) open(id uint32, extra ...hpack.HeaderField) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hbuf.Reset()
	for _, f := range []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: attackPath},
		{Name: ":authority", Value: "fusebox"}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"}} {
		_ = r.henc.WriteField(f)
	}
	for _, f := range extra {
		_ = r.henc.WriteField(f)
	}
	return r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.hbuf.Bytes(), EndHeaders: true})
}

// drain reads and drops what the server sends, acking SETTINGS and
// keeping the server's windows.
func (r *rawConn) drain() {
	go func() {
		defer func() {
			r.mu.Lock()
			r.dead = true
			r.win.Broadcast()
			r.mu.Unlock()
		}()
		for {
			f, err := r.fr.ReadFrame()
			if err != nil {
				return
			}
			r.mu.Lock()
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
						for id := range r.streamWin {
							r.streamWin[id] += int64(v) - r.initialWin
						}
						r.initialWin = int64(v)
					}
					_ = r.fr.WriteSettingsAck()
				}
			case *http2.WindowUpdateFrame:
				if f.StreamID == 0 {
					r.connWin += int64(f.Increment)
				} else if _, ok := r.streamWin[f.StreamID]; ok {
					r.streamWin[f.StreamID] += int64(f.Increment)
				}
			}
			r.win.Broadcast()
			r.mu.Unlock()
		}
	}()
}

func TestAttackKit(t *testing.T) {
	attacks := []struct {
		name string
		// run attacks tg and returns the bound on its resident memory
		// during the attack (MiB).
		run func(t *testing.T, tg *target) (boundMiB float64)
	}{
		{"connections to the descriptor limit", attackDescriptors},
		{"a client that stops reading", attackStopsReading},
		{"pings with a stream open", attackPings},
		{"unfinished large messages", attackLargeMessages},
		{"one connection taking every stream", attackEveryStream},
		{"an HPACK bomb of -bin headers", attackHPACKBomb},
	}
	for _, a := range attacks {
		for _, server := range []string{"fusebox", "grpc-go"} {
			t.Run(a.name+"/"+server, func(t *testing.T) {
				tg := startTarget(t, server)
				l := startLegit(t, tg.addr)
				peak := 0.0
				stopSampling := make(chan struct{})
				sampled := make(chan struct{})
				go func() {
					defer close(sampled)
					for {
						peak = max(peak, tg.rssMiB())
						select {
						case <-stopSampling:
							return
						case <-time.After(20 * time.Millisecond):
						}
					}
				}()
				bound := a.run(t, tg)
				close(stopSampling)
				<-sampled
				l.finish()
				if !tg.alive() {
					t.Fatalf("the process died: %s", tg.cmd.Stderr)
				}
				t.Logf("legitimate client: %d calls, %d failed, slowest %v; peak RSS %.0f MiB (bound %.0f)",
					l.calls.Load(), l.failures.Load(), time.Duration(l.slowest.Load()).Round(time.Millisecond), peak, bound)
				if l.failures.Load() > 0 || l.calls.Load() == 0 {
					t.Errorf("the legitimate client was not answered: %d of %d calls failed (%v)", l.failures.Load(), l.calls.Load(), l.lastErr.Load())
				}
				if peak > bound {
					if why, ok := attackUnbounded[a.name]; ok && server == "grpc-go" {
						t.Logf("over the bound on grpc-go, listed: %s", why)
					} else {
						t.Errorf("peak RSS %.0f MiB, over the bound of %.0f MiB", peak, bound)
					}
				}
			})
		}
	}
}

// attackDescriptors: connections to the descriptor limit.
// It returns the bound on resident memory during it (MiB).
func attackDescriptors(t *testing.T, tg *target) float64 {
	// 256 descriptors: 400 connections run it out, and accept
	// fails with EMFILE (it ended the process before #50).
	lim := unix.Rlimit{Cur: 256, Max: 256}
	if err := unix.Prlimit(tg.cmd.Process.Pid, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	for range 400 {
		c, err := net.DialTimeout("tcp", tg.addr, time.Second)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	time.Sleep(300 * time.Millisecond)
	for _, c := range conns {
		c.Close()
	}
	// Once they are gone, a new client is served.
	time.Sleep(300 * time.Millisecond)
	if st := grpcHealth(t, tg.addr); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("a new client after the attack: %v", st)
	}
	return 128
}

// attackStopsReading: a client that stops reading.
// It returns the bound on resident memory during it (MiB).
func attackStopsReading(t *testing.T, tg *target) float64 {
	// A 4 KiB receive buffer and no reads: the server's writes to
	// it block on a full socket (ending its streams did, and the
	// sweep with them, before #50).
	r := dialAttack(t, tg.addr, 4096)
	for i := range 2000 {
		id := uint32(2*i + 1)
		if r.open(id) != nil {
			break
		}
		msg := []byte{0, 0, 0, 0, 0} // an empty ProcessingRequest: a reply
		_ = r.fr.WriteData(id, false, msg)
	}
	time.Sleep(time.Second)
	return 128
}

// attackPings: pings with a stream open.
// It returns the bound on resident memory during it (MiB).
func attackPings(t *testing.T, tg *target) float64 {
	r := dialAttack(t, tg.addr, 0)
	r.drain()
	_ = r.open(1)
	sent, closed := 0, false
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		if closed {
			// The server sent GOAWAY and closed: the legitimate
			// client goes on for the rest of the second.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		r.mu.Lock()
		err := r.fr.WritePing(false, [8]byte{1})
		r.mu.Unlock()
		if closed = err != nil; !closed {
			sent++
		}
	}
	t.Logf("%d pings written before the server closed the connection", sent)
	return 128
}

// attackLargeMessages: unfinished large messages.
// It returns the bound on resident memory during it (MiB).
func attackLargeMessages(t *testing.T, tg *target) float64 {
	// 12 messages of 32 MiB, each 30 MiB in and never finished,
	// on 4 connections, within the server's flow control: 360 MiB
	// held if nothing bounds it.
	var wg sync.WaitGroup
	for range 4 {
		r := dialAttack(t, tg.addr, 0)
		r.drain()
		wg.Add(1)
		go func() {
			defer wg.Done()
			chunk := make([]byte, 16384)
			for s := range 3 {
				id := uint32(2*s + 1)
				if r.open(id) != nil {
					return
				}
				prefix := make([]byte, 5)
				binary.BigEndian.PutUint32(prefix[1:], 32<<20-64)
				if !r.send(id, prefix) {
					return
				}
				for sent := 0; sent < 30<<20; sent += len(chunk) {
					if !r.send(id, chunk) {
						break // refused: the next stream
					}
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		// Windows withheld: the server stopped taking more, which
		// is what a bound looks like.
	}
	time.Sleep(500 * time.Millisecond)
	return 256 + 128
}

// attackEveryStream: one connection taking every stream.
// It returns the bound on resident memory during it (MiB).
func attackEveryStream(t *testing.T, tg *target) float64 {
	// The default limits: 100,000 streams in all, 12,500 a
	// connection. 20,000 opened on one connection and kept.
	r := dialAttack(t, tg.addr, 0)
	r.drain()
	for i := range 20000 {
		if r.open(uint32(2*i+1)) != nil {
			break
		}
	}
	time.Sleep(time.Second)
	return 512
}

// attackHPACKBomb: an HPACK bomb of -bin headers.
// It returns the bound on resident memory during it (MiB).
func attackHPACKBomb(t *testing.T, tg *target) float64 {
	// One 4 KB -bin value in the table, then 200 streams each
	// naming it 250 times (1 MB decoded from 250 bytes).
	r := dialAttack(t, tg.addr, 0)
	r.drain()
	big := strings.Repeat("QUFB", 1000)
	extra := make([]hpack.HeaderField, 250)
	for i := range extra {
		extra[i] = hpack.HeaderField{Name: "x-bomb-bin", Value: big}
	}
	for i := range 200 {
		if r.open(uint32(2*i+1), extra...) != nil {
			break
		}
	}
	time.Sleep(time.Second)
	return 128
}
