package mainlib

import (
	"fmt"
	"sort"
	"strings"

	"github.com/fusebox-llm/fusebox/pkg/routes"
	"go.yaml.in/yaml/v3"
)

// EnvoyCheck is what `validate -envoy` found: fusebox routes whose cluster
// the Envoy config lacks (each one's requests would end in Envoy's NC,
// 404 cluster_not_found, at run time), and provider clusters no route
// names (nothing fusebox chooses reaches them).
type EnvoyCheck struct {
	Missing []string // problems: config file, line, route, cluster
	Unused  []string // warnings: Envoy file, line, cluster
}

// CheckEnvoyClusters holds a fusebox config (fusebox, named fuseboxName in
// the report) against an Envoy config (envoy, envoyName). A cluster the
// Envoy file names outside its own definition (the ext_proc gRPC cluster,
// a route's fixed cluster, the access log's) is Envoy's own, never
// "unused".
func CheckEnvoyClusters(fusebox []byte, fuseboxName string, envoy []byte, envoyName string) (EnvoyCheck, error) {
	var fb, ev yaml.Node
	if err := yaml.Unmarshal(fusebox, &fb); err != nil {
		return EnvoyCheck{}, fmt.Errorf("%s: %w", fuseboxName, err)
	}
	if err := yaml.Unmarshal(envoy, &ev); err != nil {
		return EnvoyCheck{}, fmt.Errorf("%s: %w", envoyName, err)
	}
	defined := map[string]int{} // Envoy cluster → its line
	referenced := map[string]bool{}
	walkEnvoy(&ev, false, defined, referenced)
	if len(defined) == 0 {
		return EnvoyCheck{}, fmt.Errorf("%s: no static_resources.clusters", envoyName)
	}
	var out EnvoyCheck
	names := make([]string, 0, len(defined))
	for n := range defined {
		names = append(names, n)
	}
	named := map[string]bool{}
	for _, r := range routeClusters(&fb, "") {
		named[r.cluster] = true
		if _, ok := defined[r.cluster]; !ok {
			// Envoy answers a cluster_header naming no cluster 503 NC
			// (cluster_not_found), R-O12; before, this said 404.
			out.Missing = append(out.Missing, fmt.Sprintf("%s:%d: %s: cluster %q: %s has no such cluster (its requests would end in Envoy's 503 NC, cluster_not_found)%s",
				fuseboxName, r.line, r.path, r.cluster, envoyName, routes.DidYouMean(r.cluster, names)))
		}
	}
	sort.Slice(names, func(i, j int) bool { return defined[names[i]] < defined[names[j]] })
	for _, n := range names {
		if !named[n] && !referenced[n] {
			out.Unused = append(out.Unused, fmt.Sprintf("%s:%d: cluster %q: no route of %s names it (nothing fusebox chooses reaches it)",
				envoyName, defined[n], n, fuseboxName))
		}
	}
	return out, nil
}

// walkEnvoy collects static_resources.clusters[*].name (defined) and every
// cluster named anywhere else (referenced: cluster, cluster_name).
func walkEnvoy(n *yaml.Node, inClusters bool, defined map[string]int, referenced map[string]bool) {
	switch n.Kind {
	case yaml.DocumentNode, yaml.SequenceNode:
		for _, c := range n.Content {
			walkEnvoy(c, inClusters, defined, referenced)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			switch {
			case k.Value == "clusters" && v.Kind == yaml.SequenceNode && !inClusters:
				for _, c := range v.Content {
					if name := mapValue(c, "name"); name != nil {
						defined[name.Value] = name.Line
					}
					walkEnvoy(c, true, defined, referenced)
				}
				continue
			case (k.Value == "cluster" || k.Value == "cluster_name") && v.Kind == yaml.ScalarNode && !inClusters:
				referenced[v.Value] = true
			}
			walkEnvoy(v, inClusters, defined, referenced)
		}
	}
}

func mapValue(n *yaml.Node, key string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

type routeCluster struct {
	cluster, path string
	line          int
}

// routeClusters finds every routes[i].cluster in a fusebox config, with
// its path (gateways[0].routes[1].cluster) and line.
func routeClusters(n *yaml.Node, path string) []routeCluster {
	var out []routeCluster
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			out = append(out, routeClusters(c, path)...)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			out = append(out, routeClusters(c, fmt.Sprintf("%s[%d]", path, i))...)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := strings.TrimPrefix(path+"."+k.Value, ".")
			if k.Value == "routes" && v.Kind == yaml.SequenceNode {
				for j, r := range v.Content {
					if c := mapValue(r, "cluster"); c != nil && c.Kind == yaml.ScalarNode {
						out = append(out, routeCluster{cluster: c.Value, path: fmt.Sprintf("%s[%d].cluster", p, j), line: c.Line})
					}
				}
				continue
			}
			out = append(out, routeClusters(v, p)...)
		}
	}
	return out
}
