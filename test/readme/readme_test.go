package readme

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// commands returns the README's shell commands, block by block, in order:
// each line of a ```sh block, its trailing comment dropped.
func commands(readme string) [][]string {
	var blocks [][]string
	var cur []string
	in := false
	sc := bufio.NewScanner(strings.NewReader(readme))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !in && strings.TrimSpace(line) == "```sh":
			in, cur = true, nil
		case in && strings.TrimSpace(line) == "```":
			in = false
			blocks = append(blocks, cur)
		case in:
			cmd := line
			if i := strings.Index(cmd, "  #"); i >= 0 {
				cmd = cmd[:i]
			}
			if cmd = strings.TrimSpace(cmd); cmd != "" {
				cur = append(cur, cmd)
			}
		}
	}
	return blocks
}

func TestCommandsAreFound(t *testing.T) {
	got := commands("x\n```sh\nmake run    # a comment\n\nmake test\n```\n```yaml\nno: 1\n```\n```sh\ncurl -s x\n```\n")
	if fmt.Sprint(got) != "[[make run make test] [curl -s x]]" {
		t.Fatalf("%q", got)
	}
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestEveryREADMECommandRuns: the first block's `make run` is started (on
// free ports, which the later commands' 127.0.0.1:8090 is rewritten to, so
// that the test needs no fixed port) and serves until the end; `make test`
// is what CI runs (.ci/run's last command: this test is in it); every other
// command runs in order from the checkout's root and must exit 0, curl with
// -f added, so that an HTTP error fails it.
func TestEveryREADMECommandRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs fusebox and the demo")
	}
	for _, tool := range []string{"make", "curl", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is needed (.ci/run installs it)", tool)
			}
			t.Skipf("%s is not installed", tool)
		}
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := commands(string(readme))
	if len(blocks) < 2 || fmt.Sprint(blocks[0]) != "[make run make test]" {
		t.Fatalf("the README's first block is not the two commands: %q", blocks)
	}
	ci, err := os.ReadFile(filepath.Join(root, ".ci/run"))
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(string(ci)), "\n"); lines[len(lines)-1] != "make test" {
		t.Fatalf(".ci/run does not end with the README's make test: %q", lines[len(lines)-1])
	}

	admin, grpcAddr := freePort(t), freePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	run := exec.CommandContext(ctx, "make", "run", "ARGS=-admin-addr "+admin+" -grpc-addr "+grpcAddr)
	run.Dir = root
	run.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // make and fusebox, stopped together
	var out strings.Builder
	run.Stdout, run.Stderr = &out, &out
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = syscall.Kill(-run.Process.Pid, syscall.SIGTERM)
		_ = run.Wait()
	}()
	ready := false
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if resp, err := http.Get("http://" + admin + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				ready = true
				break
			}
		}
		if run.ProcessState != nil {
			break
		}
	}
	if !ready {
		t.Fatalf("make run never became ready:\n%s", out.String())
	}

	ran := 0
	for _, block := range blocks[1:] {
		for _, cmd := range block {
			line := strings.ReplaceAll(cmd, "127.0.0.1:8090", admin)
			if strings.HasPrefix(line, "curl ") {
				line = "curl -f " + strings.TrimPrefix(line, "curl ")
			}
			c := exec.CommandContext(ctx, "bash", "-c", line)
			c.Dir = root
			b, err := c.CombinedOutput()
			if err != nil {
				t.Errorf("%s: %v\n%s", cmd, err, tail(string(b)))
			}
			ran++
		}
	}
	if ran < 5 {
		t.Fatalf("only %d commands ran", ran)
	}
}

func tail(s string) string {
	if len(s) > 2000 {
		return "…" + s[len(s)-2000:]
	}
	return s
}

// The README is what a newcomer reads first: at most 250 lines, and every
// page it sends them to exists, as does every page a docs page links to.
func TestREADMEIsShortAndItsLinksResolve(t *testing.T) {
	root := "../.."
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(readme), "\n"); n > 250 {
		t.Errorf("the README has %d lines; the rest belongs in docs/", n)
	}
	pages := map[string]string{"README.md": string(readme)}
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	for _, d := range docs {
		b, err := os.ReadFile(d)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, d)
		pages[rel] = string(b)
	}
	for page, text := range pages {
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "#") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			if _, err := os.Stat(filepath.Join(root, filepath.Dir(page), target)); err != nil {
				t.Errorf("%s links to %s, which does not exist", page, m[1])
			}
		}
	}
}

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
