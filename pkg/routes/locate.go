package routes

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Every config problem names its line and YAML path (R-P1). The compiler
// speaks of what the operator named (gateway "default": model "gpt": …);
// locate finds where in the document that is, so a problem found after
// decoding (a duplicate, an unknown reference) points at its line as a
// decoding error does:
//
//	gateway "default": route "a:b:c": key: defined twice (line 9, gateways[0].routes[1].key)

var (
	reContext  = regexp.MustCompile(`^(gateway|model|route|fleet) ("(?:[^"\\]|\\.)*"): `)
	reLineOnly = regexp.MustCompile(` \(line (\d+)\)$`)
	reQuoted   = regexp.MustCompile(`^"((?:[^"\\]|\\.)*)"`)
)

// locateProblems gives each problem of data's compilation its line and
// path when it names a place the document has.
func locateProblems(problems []string, data []byte) []string {
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil || len(root.Content) == 0 {
		return problems
	}
	out := make([]string, len(problems))
	for i, p := range problems {
		out[i] = locate(p, root.Content[0])
	}
	return out
}

func locate(msg string, doc *yaml.Node) string {
	if reLine.MatchString(msg) {
		return msg // the decoder's: it has its line, and its path when known
	}
	node, path, rest := doc, "", msg
	for {
		m := reContext.FindStringSubmatch(rest)
		if m == nil {
			break
		}
		name, err := strconv.Unquote(m[2])
		if err != nil {
			return msg
		}
		rest = rest[len(m[0]):]
		var list, key string
		switch m[1] {
		case "gateway":
			node, path, list, key = doc, "", "gateways", "id"
		case "fleet":
			node, path, list, key = doc, "", "fleets", "name"
		case "model":
			list, key = "models", "name"
		case "route":
			list, key = "routes", "key"
		}
		nth := 0
		if m[1] == "route" && strings.HasPrefix(rest, "key: defined twice") {
			nth = 1 // the second definition is the one to fix
		}
		seq := mapValue(node, list)
		i, item := findNamed(seq, key, name, nth)
		if item == nil {
			return msg
		}
		node, path = item, joinPath(path, fmt.Sprintf("%s[%d]", list, i))
	}
	field, problem, ok := strings.Cut(rest, ": ")
	if !ok || !isFieldPath(field) {
		return withPlace(msg, node.Line, path)
	}
	line := 0
	if m := reLineOnly.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = strings.TrimSuffix(msg, m[0])
	}
	target, fpath := node, path
	for _, part := range strings.Split(field, ".") {
		next := mapValue(target, part)
		if next == nil {
			break
		}
		if k := mapKey(target, part); k != nil && line == 0 {
			line = k.Line
		}
		target, fpath = next, joinPath(fpath, part)
	}
	// A list entry the problem quotes: "x" is not a route / listed twice.
	if target.Kind == yaml.SequenceNode {
		if q := reQuoted.FindStringSubmatch(problem); q != nil {
			want, _ := strconv.Unquote(`"` + q[1] + `"`)
			for i, c := range target.Content {
				if c.Kind == yaml.ScalarNode && c.Value == want {
					fpath, line = fmt.Sprintf("%s[%d]", fpath, i), c.Line
				}
			}
		}
	}
	if line == 0 {
		line = target.Line
	}
	return withPlace(msg, line, fpath)
}

func withPlace(msg string, line int, path string) string {
	if path == "" {
		return fmt.Sprintf("%s (line %d)", msg, line)
	}
	return fmt.Sprintf("%s (line %d, %s)", msg, line, path)
}

func joinPath(a, b string) string {
	if a == "" {
		return b
	}
	return a + "." + b
}

var reFieldPath = regexp.MustCompile(`^[a-z_]+(\.[a-z_]+)*$`)

func isFieldPath(s string) bool { return reFieldPath.MatchString(s) }

func mapValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

func mapKey(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i]
		}
	}
	return nil
}

// findNamed is the nth (0-based) entry of seq whose key field is name.
func findNamed(seq *yaml.Node, key, name string, nth int) (int, *yaml.Node) {
	if seq == nil || seq.Kind != yaml.SequenceNode {
		return -1, nil
	}
	var last *yaml.Node
	lastI := -1
	for i, c := range seq.Content {
		if v := mapValue(c, key); v != nil && v.Value == name {
			last, lastI = c, i
			if nth == 0 {
				return i, c
			}
			nth--
		}
	}
	return lastI, last
}

// DidYouMean is `; did you mean "x"?` for the known name closest to got,
// when one is close enough to be a typo, else "" (validate -envoy's
// cluster names use it too).
func DidYouMean(got string, known []string) string { return didYouMean(got, known) }

// didYouMean is DidYouMean.
func didYouMean(got string, known []string) string {
	// Bounded: a hostile document may name a 60 KB key, and the distance
	// costs the product of the lengths.
	if len(got) > maxSuggestLen {
		return ""
	}
	best, bestD := "", len(got)/3+2
	sorted := append([]string(nil), known...)
	sort.Strings(sorted)
	for _, k := range sorted {
		if len(k) > maxSuggestLen || abs(len(k)-len(got)) >= bestD {
			continue
		}
		if d := editDistance(got, k); d < bestD && k != got {
			best, bestD = k, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf("; did you mean %q?", best)
}

// editDistance is the Levenshtein distance of a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// maxSuggestLen bounds the names "did you mean" compares.
const maxSuggestLen = 128

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}
