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
	if !n.fastShape() {
		b, _ := json.Marshal(n) // plain fields always marshal
		return b
	}
	b := make([]byte, 0, 160)
	b = append(b, '{')
	if p := n.Parked; p != nil {
		b = appendPark(b, p)
	}
	for _, f := range []struct {
		on, isNum bool
		key       string
		num       int
	}{{n.Later != 0, true, `"l":`, n.Later}, {n.Obs, false, `"o":true`, 0}, {n.Done, false, `"x":true`, 0}} {
		if !f.on {
			continue
		}
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = append(b, f.key...)
		if f.isNum {
			b = strconv.AppendInt(b, int64(f.num), 10)
		}
	}
	return append(b, '}')
}

// fastShape reports whether Encode writes the note by hand: only the
// common shapes (a park with plain names, the later count, the observer's
// and done marks); anything else goes through encoding/json.
func (n *Note) fastShape() bool {
	if n.Entry != nil || n.More != nil || n.Claims != nil || n.Expired || n.Rec != 0 || n.Arr != 0 {
		return false
	}
	p := n.Parked
	return p == nil || p.Elapsed == 0 && plainJSON(p.Gateway) && plainJSON(p.Route) && plainJSON(p.Cluster)
}

// appendPark writes a park whose names are plain JSON.
func appendPark(b []byte, p *Park) []byte {
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
			r.object(func(k string) { r.parkField(n.Parked, k) })
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

// parkField reads field k of a park.
func (r *noteReader) parkField(p *Park, k string) {
	switch k {
	case "n":
		p.N = int(r.int(strconv.IntSize))
	case "g":
		p.Gateway = r.str()
	case "r":
		p.Route = r.str()
	case "c":
		p.Cluster = r.str()
	case "s":
		p.Start = r.int(64)
	default:
		if u := r.parkUint(p, k); u != nil {
			*u = r.uint()
			return
		}
		r.ok = false
	}
}

// parkUint is the park's generation or lease field named k, nil for any
// other name.
func (r *noteReader) parkUint(p *Park, k string) *uint64 {
	switch k {
	case "rg":
		return &p.RouteGen
	case "rl":
		return &p.RouteLease
	case "fg":
		return &p.FleetGen
	case "fl":
		return &p.FleetLease
	}
	return nil
}
