package mainlib

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func get(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func grpcHealth(t *testing.T, addr string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatalf("health check: %v", err)
	}
	return resp.Status
}

func TestStartServeDrain(t *testing.T) {
	t.Setenv("FUSEBOX_ADMIN_TOKEN", "s3cret")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs := &syncBuffer{}
	in, err := Start(ctx, []string{"-grpc-addr", "127.0.0.1:0", "-admin-addr", "127.0.0.1:0", "-grace-period", "300ms"}, logs)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- in.Wait() }()
	base := "http://" + in.AdminAddr()

	checkServing(t, in, base, logs)

	// An ext_proc stream opened before SIGTERM keeps working during the drain.
	conn, err := grpc.NewClient(in.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cancel() // SIGTERM
	checkDraining(t, in, base)
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil || resp.GetRequestHeaders() == nil {
		t.Fatalf("stream during drain: %v %v", resp, err)
	}
	_ = stream.CloseSend()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("did not stop after the grace period")
	}
}

// checkServing: health, readiness, metrics, the admin token and gRPC
// health of an instance that serves.
func checkServing(t *testing.T, in *Instance, base string, logs *syncBuffer) {
	t.Helper()
	if code, _ := get(t, base+"/healthz", ""); code != 200 {
		t.Fatalf("/healthz %d", code)
	}
	if code, body := get(t, base+"/readyz", ""); code != 200 || !strings.Contains(body, `"ready":true`) {
		t.Fatalf("/readyz %d %s", code, body)
	}
	if code, body := get(t, base+"/metrics", ""); code != 200 || !strings.Contains(body, `aig_config_reloads_total{result="error"} 0`) {
		t.Fatalf("/metrics %d", code)
	}
	// Token middleware.
	if code, body := get(t, base+"/admin/v1/nothing", ""); code != 401 || !strings.Contains(body, `"error"`) {
		t.Fatalf("no token: %d %s", code, body)
	}
	if code, _ := get(t, base+"/admin/v1/nothing", "wrong"); code != 401 {
		t.Fatalf("wrong token: %d", code)
	}
	if code, _ := get(t, base+"/admin/v1/nothing", "s3cret"); code != 404 {
		t.Fatalf("right token: %d", code)
	}
	if strings.Contains(logs.String(), "s3cret") {
		t.Fatal("token logged")
	}
	if st := grpcHealth(t, in.GRPCAddr()); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("grpc health %v", st)
	}
}

// checkDraining: after SIGTERM, health says not serving and readiness
// says draining.
func checkDraining(t *testing.T, in *Instance, base string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for grpcHealth(t, in.GRPCAddr()) != healthpb.HealthCheckResponse_NOT_SERVING {
		if time.Now().After(deadline) {
			t.Fatal("health still serving after SIGTERM")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if code, body := get(t, base+"/readyz", ""); code != 503 || !strings.Contains(body, `"draining":true`) {
		t.Fatalf("/readyz while draining: %d %s", code, body)
	}
}

func TestNoTokenNonLoopbackIs403(t *testing.T) {
	t.Setenv("FUSEBOX_ADMIN_TOKEN", "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs := &syncBuffer{}
	// 0.0.0.0 is not a loopback listener.
	in, err := Start(ctx, []string{"-grpc-addr", "127.0.0.1:0", "-admin-addr", "0.0.0.0:0", "-grace-period", "0s"}, logs)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = in.Wait() }()
	port := in.AdminAddr()[strings.LastIndex(in.AdminAddr(), ":"):]
	if code, _ := get(t, "http://127.0.0.1"+port+"/admin/v1/x", ""); code != 403 {
		t.Fatalf("want 403, got %d", code)
	}
	if code, _ := get(t, "http://127.0.0.1"+port+"/healthz", ""); code != 200 {
		t.Fatalf("healthz needs no token, got %d", code)
	}
	if !strings.Contains(logs.String(), "answers 403") {
		t.Fatal("no start-up warning")
	}
}

func TestValidateSubcommand(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte(`
gateways:
  - id: g
    circuit_breaker: {failure_status_codes: "500", failure_threshold: 0}
    models: [{name: m, routes: ["p:r:a", "p:r:zz"]}]
    routes: [{key: "p:r:a", cluster: a, api: gemini}]
`), 0o600)
	var out, errb bytes.Buffer
	err := Main(context.Background(), []string{"validate", "-config", bad}, &out, &errb)
	if err == nil {
		t.Fatal("validate accepted a broken file")
	}
	for _, w := range []string{"circuit_breaker.failure_status_codes", "circuit_breaker.failure_threshold", `route "p:r:a": api`, `"p:r:zz" is not a route`} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("validate output lacks %q:\n%s", w, out.String())
		}
	}
	// #54: every problem is file:line: path: message, as the -envoy
	// cross-check writes its own. Before, the config's problems named no
	// file and put "(line N, path)" last.
	problems := 0
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		problems++
		if !regexp.MustCompile(`^`+regexp.QuoteMeta(bad)+`:\d+: [^ ]+: `).MatchString(l) || strings.Contains(l, "(line ") {
			t.Errorf("not file:line: path: message: %q", l)
		}
	}
	if problems < 4 {
		t.Errorf("%d problem lines:\n%s", problems, out.String())
	}
	out.Reset()
	if err := Main(context.Background(), []string{"validate"}, &out, &errb); err != nil || !strings.Contains(out.String(), "ok") {
		t.Fatalf("embedded default: %v %s", err, out.String())
	}
	out.Reset()
	if err := Main(context.Background(), []string{"config"}, &out, &errb); err != nil ||
		!strings.Contains(out.String(), "effective config of embedded default config") || !strings.Contains(out.String(), "failure_threshold: 5") {
		t.Fatalf("config: %v %s", err, out.String())
	}
	out.Reset()
	if err := Main(context.Background(), []string{"version"}, &out, &errb); err != nil || !strings.HasPrefix(out.String(), "fusebox extproc") {
		t.Fatalf("version: %v %q", err, out.String())
	}
	if _, err := Start(context.Background(), []string{"-log-format", "xml"}, &errb); err == nil {
		t.Fatal("bad flag accepted")
	}
}

// The real binary with no flags starts on the embedded config and answers
// /healthz and gRPC health on the default addresses; SIGTERM exits 0.
func TestBinaryNoFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	// The default ports must be free, or another process could answer
	// for ours.
	for _, addr := range []string{"127.0.0.1:8090", "127.0.0.1:50051"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("default address %s is taken by another process: %v", addr, err)
		}
		ln.Close()
	}
	cmd := exec.Command(bin)
	logs := &syncBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	waitHealthz(t, "http://127.0.0.1:8090/healthz", logs)
	if st := grpcHealth(t, "127.0.0.1:50051"); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("grpc health %v", st)
	}
	// The default grace period is 15 s; a second signal is not needed, so
	// check SIGTERM → not serving, then stop the process.
	cmd.Process.Signal(syscall.SIGTERM)
	waitNotServing(t, "127.0.0.1:50051")
	// It was our process that answered: its log names the default
	// addresses, and a second signal ends it at once (the grace period is
	// 15 s), after which nothing answers there.
	if l := logs.String(); !strings.Contains(l, "grpc=127.0.0.1:50051") || !strings.Contains(l, "admin=127.0.0.1:8090") {
		t.Fatalf("the log does not name the default addresses:\n%s", l)
	}
	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	if time.Since(start) > 5*time.Second {
		t.Fatalf("a second SIGTERM took %v to exit", time.Since(start))
	}
	if err == nil || !strings.Contains(logs.String(), "second signal") {
		t.Fatalf("second signal: exit %v\n%s", err, logs.String())
	}
	if _, err := http.Get("http://127.0.0.1:8090/healthz"); err == nil {
		t.Fatal("something still answers on the admin port after our process exited")
	}
}

// buildBinary builds fusebox into the test's directory.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "extproc")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/fusebox-llm/fusebox/cmd/extproc").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// waitHealthz waits up to 20 s for url to answer 200.
func waitHealthz(t *testing.T, url string, logs *syncBuffer) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s; logs:\n%s", url, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitNotServing waits up to 5 s for addr's gRPC health to say NOT_SERVING.
func waitNotServing(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for grpcHealth(t, addr) != healthpb.HealthCheckResponse_NOT_SERVING {
		if time.Now().After(deadline) {
			t.Fatal("not draining after SIGTERM")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestBinarySIGTERMExitsZero(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	cmd := exec.Command(bin, "-grpc-addr", "127.0.0.1:0", "-admin-addr", "127.0.0.1:0", "-grace-period", "100ms")
	logs := &syncBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(logs.String(), "fusebox serving") {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("did not start: %s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// R-L9: idle, no free-running ticker (the clock parks one second
	// after the last read). Counted in wake-ups, which a busy machine
	// does not change: idle fusebox runs about 40 times in 2 s (Go's own
	// timers included); a 1 ms ticker is 2,000. CPU time is only held to
	// a bound a spinning goroutine breaks (a whole core is 2 s): on a
	// machine at load 4–16 the same idle 2 s measured 11.2 ms of CPU
	// where an idle machine measures 2.5 ms, so a 0.5 % bound on CPU time
	// judged the machine, not fusebox (#54).
	// Up to three 2 s windows, the first 1.5 s after "serving": a
	// free-running ticker or a spinning goroutine fails every one, while
	// the start-up's last work (the clock parks one second after its last
	// read) may still fall into the first on a loaded machine: at load 15
	// beside a CI run, the first window counted 1,045 runs where the same
	// binary idle measures about 70 (#54).
	time.Sleep(1500 * time.Millisecond)
	var wakes int64
	var used time.Duration
	for range 3 {
		c0, w0 := threadsCPU(t, cmd.Process.Pid)
		time.Sleep(2 * time.Second)
		c1, w1 := threadsCPU(t, cmd.Process.Pid)
		if wakes, used = w1-w0, c1-c0; wakes <= 200 && used <= 200*time.Millisecond {
			break
		}
	}
	if wakes > 200 {
		t.Errorf("idle for 2 s (three times), fusebox ran %d times the last (a ticker faster than 100 Hz)", wakes)
	}
	if used > 200*time.Millisecond {
		t.Errorf("idle for 2 s (three times), fusebox used %v of CPU the last (a goroutine that spins)", used)
	}
	// A SIGHUP on the embedded default config is said and ignored. Before,
	// nothing was registered for it without -config, and it killed the
	// process (Go's default).
	cmd.Process.Signal(syscall.SIGHUP)
	for !strings.Contains(logs.String(), "no config file to reload") {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("SIGHUP not acknowledged: %s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGHUP, then SIGTERM: %v\n%s", err, logs.String())
	}
}

// threadsCPU sums the CPU time of a process's threads and the times they
// were scheduled to run (/proc/<pid>/task/*/schedstat: run time in ns,
// wait time, timeslices); threads do not exit while it idles.
func threadsCPU(t *testing.T, pid int) (time.Duration, int64) {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		t.Skipf("no schedstat for pid %d", pid)
	}
	var sum time.Duration
	var runs int64
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var ns, wait, slices int64
		fmt.Sscan(string(b), &ns, &wait, &slices)
		sum += time.Duration(ns)
		runs += slices
	}
	return sum, runs
}

// The config file is reloaded on change and on SIGHUP; a bad file is
// refused and counted, the last good config stays.
func TestReloadWiring(t *testing.T) {
	in, path, good := startWithFile(t, "1h", &syncBuffer{})
	metric := func(result string) bool {
		_, body := get(t, "http://"+in.AdminAddr()+"/metrics", "")
		return strings.Contains(body, `aig_config_reloads_total{result="`+result+`"} 1`)
	}
	first := in.Config.Load()
	// The poll interval is an hour: only SIGHUP can apply a change here.
	// A broken file is refused.
	if err := os.WriteFile(path, []byte("gateways: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for !metric("error") {
		if time.Now().After(deadline) {
			t.Fatal("bad file not refused")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if in.Config.Load() != first {
		t.Fatal("a bad file replaced the config")
	}
	// A good file, delivered by SIGHUP.
	if err := os.WriteFile(path, []byte(strings.Replace(string(good), "failure_threshold: 5", "failure_threshold: 7", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	for !metric("success") {
		if time.Now().After(deadline) {
			t.Fatal("good file not applied")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if in.Config.Load().Gateways["default"].Policy.FailureThreshold != 7 {
		t.Fatal("new config not in force")
	}
	// Without SIGHUP nothing is applied within many would-be poll periods.
	if err := os.WriteFile(path, []byte(strings.Replace(string(good), "failure_threshold: 5", "failure_threshold: 9", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if in.Config.Load().Gateways["default"].Policy.FailureThreshold != 7 {
		t.Fatal("a change was applied without SIGHUP")
	}
}

// The poller applies a changed file on its own.
func TestReloadPolling(t *testing.T) {
	in, path, good := startWithFile(t, "10ms", &syncBuffer{})
	if err := os.WriteFile(path, []byte(strings.Replace(string(good), "failure_threshold: 5", "failure_threshold: 6", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for in.Config.Load().Gateways["default"].Policy.FailureThreshold != 6 {
		if time.Now().After(deadline) {
			t.Fatal("the poller did not apply the changed file")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// R-P10: validate runs every check start-up runs.
func TestValidateRefusesWhatStartRefuses(t *testing.T) {
	good, err := os.ReadFile("../../../pkg/routes/default.yaml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "redis.yaml")
	// A Redis URL that no client can use: validate names it as start does.
	bad := strings.Replace(string(good), "backend: memory", "backend: redis\n  redis: {url: \"http://redis.example:6379\"}", 1)
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	verr := Main(context.Background(), []string{"validate", "-config", path}, &out, &errb)
	_, serr := Start(context.Background(), []string{"-config", path, "-grpc-addr", "127.0.0.1:0", "-admin-addr", "127.0.0.1:0"}, &errb)
	if serr == nil {
		t.Fatal("start accepted an http:// store.redis.url")
	}
	if verr == nil || !strings.Contains(out.String(), "store.redis.url") {
		t.Fatalf("validate accepted what start refuses (%v): %s", serr, out.String())
	}
}

// R-P10: a reload keeps the start-only settings in force and warns, naming
// each changed field.
func TestReloadKeepsStartSettings(t *testing.T) {
	logs := &syncBuffer{}
	in, path, good := startWithFile(t, "1h", logs)
	before := in.Config.Load()
	changed := strings.Replace(string(good), "failure_threshold: 5", "failure_threshold: 8", 1)
	changed = strings.Replace(changed, "  grpc: 127.0.0.1:50051\n  admin: 127.0.0.1:8090\n", "  grpc: 127.0.0.1:1\n  admin: 127.0.0.1:2\nadmin: {token_env: OTHER_TOKEN}\n", 1)
	if err := os.WriteFile(path, []byte(changed), 0o600); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for in.Config.Load().Gateways["default"].Policy.FailureThreshold != 8 {
		if time.Now().After(deadline) {
			t.Fatal("reload not applied")
		}
		time.Sleep(10 * time.Millisecond)
	}
	after := in.Config.Load()
	if after.Listen != before.Listen || after.Admin != before.Admin {
		t.Fatalf("start-only settings changed by a reload: %+v %+v", after.Listen, after.Admin)
	}
	for _, f := range []string{"listen.grpc", "listen.admin", "admin.token_env"} {
		if !strings.Contains(logs.String(), f+" changed in the file") {
			t.Errorf("no warning naming %s:\n%s", f, logs.String())
		}
	}
}

// startWithFile starts fusebox on a copy of the embedded default config
// polled every interval; it returns the instance, the file and its text.
func startWithFile(t *testing.T, interval string, logs io.Writer) (*Instance, string, []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fusebox.yaml")
	good, err := os.ReadFile("../../../pkg/routes/default.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, good, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in, err := Start(ctx, []string{"-config", path, "-grpc-addr", "127.0.0.1:0", "-admin-addr", "127.0.0.1:0", "-grace-period", "0s", "-reload-interval", interval}, logs)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = in.Wait() })
	return in, path, good
}
