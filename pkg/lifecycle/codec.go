package lifecycle

import (
	"encoding/json"
	"strconv"
)

// The decision's note travels between replicas as JSON (breaker.Store
// notes; replicas of several versions read each other's). encoding/json was
// a twentieth of the observer's CPU (pprof, BenchmarkObserverProfile: one
// encode and one decode at the route role's end and at the observer's
// start), so the common shapes are written and read here, in the same
// JSON: a note with an access log entry in it, a string needing an escape,
// or anything this reader does not expect goes through encoding/json, and
// a fuzz target holds the two to one result (FuzzAttemptNoteJSON).

// Encode returns the note as JSON, nil when it is empty.
func (n *Note) Encode() []byte {
	if n.empty() {
		return nil
	}
	if n.Entry != nil || n.More != nil || n.Claims != nil || n.Expired || n.Rec != 0 || n.Arr != 0 || (n.Parked != nil && n.Parked.Elapsed != 0) || (n.Parked != nil && !(plainJSON(n.Parked.Gateway) && plainJSON(n.Parked.Route) && plainJSON(n.Parked.Cluster))) {
		b, _ := json.Marshal(n) // plain fields always marshal
		return b
	}
	b := make([]byte, 0, 160)
	b = append(b, '{')
	sep := func() {
		if len(b) > 1 {
			b = append(b, ',')
		}
	}
	if p := n.Parked; p != nil {
		b = append(b, `"p":{"n":`...)
		b = strconv.AppendInt(b, int64(p.N), 10)
		b = append(b, `,"g":"`...)
		b = append(b, p.Gateway...)
		b = append(b, `","r":"`...)
		b = append(b, p.Route...)
		b = append(b, `","c":"`...)
		b = append(b, p.Cluster...)
		b = append(b, `","rg":`...)
		b = strconv.AppendUint(b, p.RouteGen, 10)
		for _, f := range []struct {
			k string
			v uint64
		}{{`,"rl":`, p.RouteLease}, {`,"fg":`, p.FleetGen}, {`,"fl":`, p.FleetLease}} {
			if f.v != 0 {
				b = append(b, f.k...)
				b = strconv.AppendUint(b, f.v, 10)
			}
		}
		b = append(b, `,"s":`...)
		b = strconv.AppendInt(b, p.Start, 10)
		b = append(b, '}')
	}
	if n.Later != 0 {
		sep()
		b = append(b, `"l":`...)
		b = strconv.AppendInt(b, int64(n.Later), 10)
	}
	if n.Obs {
		sep()
		b = append(b, `"o":true`...)
	}
	if n.Done {
		sep()
		b = append(b, `"x":true`...)
	}
	return append(b, '}')
}

// plainJSON reports whether s is written in JSON as it is: printable
// ASCII without a quote or a backslash.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// decodeAttemptNote reads a note as encoding/json does (its error too).
func Decode(b []byte, n *Note) error {
	*n = Note{}
	if readAttemptNote(b, n) {
		return nil
	}
	*n = Note{}
	return json.Unmarshal(b, n)
}

// noteReader reads the JSON encode writes, and reports false at anything
// else (whitespace, escapes, other keys, an entry, floats, nulls).
type noteReader struct {
	b  []byte
	ok bool
}

func (r *noteReader) byte(c byte) {
	if r.ok && len(r.b) > 0 && r.b[0] == c {
		r.b = r.b[1:]
		return
	}
	r.ok = false
}

// key reads `"k":` and returns k.
func (r *noteReader) key() string {
	s := r.str()
	r.byte(':')
	return s
}

func (r *noteReader) str() string {
	r.byte('"')
	if !r.ok {
		return ""
	}
	for i := 0; i < len(r.b); i++ {
		switch c := r.b[i]; {
		case c == '"':
			s := string(r.b[:i])
			r.b = r.b[i+1:]
			return s
		case c < 0x20 || c > 0x7e || c == '\\':
			r.ok = false
			return ""
		}
	}
	r.ok = false
	return ""
}

// digits returns the run of an integer (a sign allowed when signed), in
// JSON's grammar: no leading zero, no fraction or exponent after it.
func (r *noteReader) digits(signed bool) string {
	if !r.ok {
		return ""
	}
	i := 0
	if signed && i < len(r.b) && r.b[i] == '-' {
		i++
	}
	j := i
	for j < len(r.b) && r.b[j] >= '0' && r.b[j] <= '9' {
		j++
	}
	if j == i || (r.b[i] == '0' && j > i+1) || (j < len(r.b) && (r.b[j] == '.' || r.b[j] == 'e' || r.b[j] == 'E')) {
		r.ok = false
		return ""
	}
	s := string(r.b[:j])
	r.b = r.b[j:]
	return s
}

func (r *noteReader) int(bits int) int64 {
	v, err := strconv.ParseInt(r.digits(true), 10, bits)
	if err != nil {
		r.ok = false
	}
	return v
}

func (r *noteReader) uint() uint64 {
	v, err := strconv.ParseUint(r.digits(false), 10, 64)
	if err != nil {
		r.ok = false
	}
	return v
}

func (r *noteReader) bool() bool {
	switch {
	case !r.ok:
	case len(r.b) >= 4 && string(r.b[:4]) == "true":
		r.b = r.b[4:]
		return true
	case len(r.b) >= 5 && string(r.b[:5]) == "false":
		r.b = r.b[5:]
		return false
	}
	r.ok = false
	return false
}

// object reads {k:v,...}, calling field for each key.
func (r *noteReader) object(field func(k string)) {
	r.byte('{')
	if r.ok && len(r.b) > 0 && r.b[0] == '}' {
		r.b = r.b[1:]
		return
	}
	for r.ok {
		field(r.key())
		if !r.ok || len(r.b) == 0 {
			r.ok = false
			return
		}
		c := r.b[0]
		r.b = r.b[1:]
		if c == '}' {
			return
		}
		if c != ',' {
			r.ok = false
		}
	}
}

func readAttemptNote(b []byte, n *Note) bool {
	r := &noteReader{b: b, ok: true}
	r.object(func(k string) {
		switch k {
		case "p":
			if n.Parked == nil {
				n.Parked = &Park{}
			}
			p := n.Parked
			r.object(func(k string) {
				switch k {
				case "n":
					p.N = int(r.int(strconv.IntSize))
				case "g":
					p.Gateway = r.str()
				case "r":
					p.Route = r.str()
				case "c":
					p.Cluster = r.str()
				case "rg":
					p.RouteGen = r.uint()
				case "rl":
					p.RouteLease = r.uint()
				case "fg":
					p.FleetGen = r.uint()
				case "fl":
					p.FleetLease = r.uint()
				case "s":
					p.Start = r.int(64)
				default:
					r.ok = false
				}
			})
		case "l":
			n.Later = int(r.int(strconv.IntSize))
		case "o":
			n.Obs = r.bool()
		case "x":
			n.Done = r.bool()
		default:
			r.ok = false
		}
	})
	return r.ok && len(r.b) == 0
}
