package storetest

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// The transition vectors of SPEC §5 (R-ST16): one table, read here and run
// on every Store the suite holds, so machine.go and breaker.lua cannot
// drift apart on any of them. vectors.txt says how a line reads.
//
//go:embed vectors.txt
var vectorsTxt string

// Vector is one line of vectors.txt.
type Vector struct {
	Rule, Name string
	Line       int
	Policy     map[string]string
	Steps      []string
}

// Section5 lists the rules of SPEC §5; every one has a vector.
var Section5 = []string{"R-S1", "R-S2", "R-S3", "R-S4", "R-S5", "R-S6", "R-W1", "R-W2",
	"R-T1", "R-T2", "R-T3", "R-T4", "R-T5", "R-T6", "R-A1"}

// Vectors parses vectors.txt.
func Vectors() ([]Vector, error) {
	var out []Vector
	for i, line := range strings.Split(vectorsTxt, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, "|")
		if len(f) != 4 {
			return nil, fmt.Errorf("vectors.txt:%d: want 4 fields, got %d", i+1, len(f))
		}
		v := Vector{Rule: strings.TrimSpace(f[0]), Name: strings.TrimSpace(f[1]), Line: i + 1, Policy: map[string]string{}}
		for _, kv := range strings.Fields(f[2]) {
			k, val, ok := strings.Cut(kv, "=")
			if !ok {
				return nil, fmt.Errorf("vectors.txt:%d: policy %q is not name=value", i+1, kv)
			}
			v.Policy[k] = val
		}
		for _, st := range strings.Fields(f[3]) {
			if x, n, ok := strings.Cut(st, "*"); ok {
				c, err := strconv.Atoi(n)
				if err != nil {
					return nil, fmt.Errorf("vectors.txt:%d: %q: %v", i+1, st, err)
				}
				for range c {
					v.Steps = append(v.Steps, x)
				}
				continue
			}
			v.Steps = append(v.Steps, st)
		}
		out = append(out, v)
	}
	return out, nil
}

// policy is the suite's base policy with the vector's fields set, by their
// config names.
func (v Vector) policy() (*breaker.Policy, error) {
	p := breaker.DefaultPolicy()
	p.Enabled, p.FailureThreshold, p.WindowSec, p.CooldownMs = true, 3, 10, 1000
	m := map[string]any{}
	for k, val := range v.Policy {
		switch {
		case k == "open_on_status_codes" || k == "failure_status_codes":
			var codes []int
			for _, c := range strings.Split(val, ",") {
				n, err := strconv.Atoi(c)
				if err != nil {
					return nil, err
				}
				codes = append(codes, n)
			}
			m[k] = codes
		default:
			if n, err := strconv.ParseFloat(val, 64); err == nil {
				m[k] = n
			} else {
				m[k] = val
			}
		}
	}
	b, _ := json.Marshal(m)
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, err
	}
	return p.Finish(), nil
}

// testVectors runs every vector on the store f makes.
func testVectors(t *testing.T, f Factory) {
	vs, err := Vectors()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		t.Run(fmt.Sprintf("%s/%s", v.Rule, v.Name), func(t *testing.T) {
			p, err := v.policy()
			if err != nil {
				t.Fatalf("vectors.txt:%d: policy: %v", v.Line, err)
			}
			vr := &vectorRun{rig: newRig(t, f, p), v: v}
			for i, st := range v.Steps {
				if err := vr.step(st); err != nil {
					t.Fatalf("vectors.txt:%d, step %d %q: %v (transitions %v)", v.Line, i+1, st, err, vr.transitions())
				}
			}
		})
	}
}

// vectorRun is one vector's breaker and what its steps hold.
type vectorRun struct {
	*rig
	v       Vector
	held    []breaker.Admission
	evSeen  int
	lastGen uint64
}

var outcomes = map[string]breaker.Result{
	"s": {Kind: breaker.KindAnswered, Status: 200, ElapsedMs: 10},
	"f": {Kind: breaker.KindStatus, Status: 503},
	"n": {Kind: breaker.KindNeither, Reason: breaker.ReasonClientCancel},
	"S": {Kind: breaker.KindAnswered, Status: 200, ElapsedMs: 5000},
	"4": {Kind: breaker.KindStatus, Status: 401},
	// c: a stream a stall already counted ends answered (only with end:).
	"c": {Kind: breaker.KindAnswered, Status: 200, MaxGapMs: 5000, Counted: true},
}

func (r *vectorRun) step(st string) error {
	if res, ok := outcomes[st]; ok {
		r.send(res)
		return nil
	}
	name, arg, _ := strings.Cut(st, "=")
	switch {
	case strings.HasPrefix(st, "+"):
		d, err := time.ParseDuration(st[1:])
		if err != nil {
			return err
		}
		r.advance(d)
	case st == "sweep":
		r.sweep()
	case name == "fo":
		d := time.Duration(0)
		if arg != "" {
			var err error
			if d, err = time.ParseDuration(arg); err != nil {
				return err
			}
		}
		r.forceOpen(d)
	case st == "fc":
		r.forceClose()
	case st == "rst":
		r.reset()
	case st == "take", st == "take!":
		adm, ok := r.acquire(st == "take!")
		if !ok {
			return fmt.Errorf("refused")
		}
		r.held = append(r.held, adm)
	case st == "refused":
		if adm, ok := r.acquire(false); ok {
			_ = r.st.Release(ctx, r.k, adm)
			return fmt.Errorf("admitted")
		}
	case strings.HasPrefix(st, "end:"), st == "free":
		if len(r.held) == 0 {
			return fmt.Errorf("no admission held")
		}
		adm := r.held[0]
		r.held = r.held[1:]
		if st == "free" {
			return r.st.Release(ctx, r.k, adm)
		}
		res, ok := outcomes[st[4:]]
		if !ok {
			return fmt.Errorf("unknown outcome")
		}
		r.record(adm, res)
	case strings.HasPrefix(name, "ra"):
		return r.retryAfter(name[2:], arg)
	case st == "stall":
		return r.st.Stalled(ctx, r.k, r.now())
	case strings.HasPrefix(st, "base:"):
		ms := map[string]int64{"fast": 250, "slow": 350}[st[5:]]
		r.send(breaker.Result{Kind: breaker.KindAnswered, Status: 200, ElapsedMs: ms, BaselineMs: 100})
	default:
		return r.check(st)
	}
	return nil
}

func (r *vectorRun) retryAfter(status, after string) error {
	code, err := strconv.Atoi(status)
	if err != nil {
		return err
	}
	d, err := time.ParseDuration(after)
	if err != nil {
		return err
	}
	r.send(breaker.Result{Kind: breaker.KindStatus, Status: code, RetryAfterUnixNano: r.now() + int64(d)})
	return nil
}

// check holds one expectation.
func (r *vectorRun) check(st string) error {
	s := r.status()
	switch {
	case strings.HasPrefix(st, "="):
		state, reason, _ := strings.Cut(st[1:], "/")
		if s.State != state || reason != "" && s.Reason != reason {
			return fmt.Errorf("state %s/%s", s.State, s.Reason)
		}
	case strings.HasPrefix(st, "#"):
		if want, _ := strconv.Atoi(st[1:]); s.Failures != want {
			return fmt.Errorf("failures %d", s.Failures)
		}
	case st == "blocked", st == "!blocked":
		if v := r.peek(); v.Blocked != (st == "blocked") {
			return fmt.Errorf("peek %+v", v)
		}
	case strings.HasPrefix(st, "ev="):
		evs := r.transitions()
		seen := r.evSeen
		r.evSeen = len(evs)
		if st == "ev=-" {
			if len(evs) != seen {
				return fmt.Errorf("new transitions %v", evs[seen:])
			}
			return nil
		}
		if len(evs) == seen || evs[len(evs)-1] != st[3:] {
			return fmt.Errorf("transitions %v since %d", evs, seen)
		}
	case strings.HasPrefix(st, "gen+"):
		want, _ := strconv.ParseUint(st[4:], 10, 64)
		g := r.generation()
		grew := g - r.lastGen
		first := r.lastGen == 0
		r.lastGen = g
		if !first && grew != want {
			return fmt.Errorf("generation grew by %d", grew)
		}
	default:
		return fmt.Errorf("unknown step")
	}
	return nil
}

// generation is the breaker's current generation: what a forced
// admission carries.
func (r *vectorRun) generation() uint64 {
	adm, _, err := r.st.Acquire(ctx, r.k, r.now(), true)
	r.must(err)
	_ = r.st.Release(ctx, r.k, adm)
	return adm.Gen
}
