package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/strvals"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// TestREADMEHelmInstall: the README's Helm install, read from the README.
// Docker, a cluster and the helm binary cannot run here, so each command
// is held to what it needs: the image stage the docker build names is in
// the Dockerfile; the Secret kubectl creates has the name the chart mounts
// and a key for every credentials file Envoy's config reads; and the chart
// renders, in Helm's own engine, with exactly the helm line's --set values,
// into a pod that runs the image built.
func TestREADMEHelmInstall(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "## Install on Kubernetes with Helm")
	if !ok {
		t.Fatal("the README has no Helm install section")
	}
	_, block, _ = strings.Cut(block, "```console\n")
	block, _, _ = strings.Cut(block, "```")
	var docker, kubectl, helm string
	for _, line := range strings.Split(block, "\n") {
		switch {
		case strings.HasPrefix(line, "docker build"):
			docker = line
		case strings.HasPrefix(line, "kubectl create secret"):
			kubectl = line
		case strings.HasPrefix(line, "helm install"):
			helm = line
		}
	}
	if docker == "" || kubectl == "" || helm == "" {
		t.Fatalf("the block lacks a step:\n%s", block)
	}

	// docker build --target STAGE -t IMAGE
	stage := regexp.MustCompile(`--target (\S+)`).FindStringSubmatch(docker)
	image := regexp.MustCompile(` -t (\S+)`).FindStringSubmatch(docker)
	dockerfile, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if stage == nil || image == nil || !regexp.MustCompile(`(?m)^FROM \S+ AS `+regexp.QuoteMeta(stage[1])+`$`).Match(dockerfile) {
		t.Fatalf("the docker build names no stage of the Dockerfile: %s", docker)
	}

	// kubectl create secret generic NAME --from-file=KEY ...
	fields := strings.Fields(kubectl)
	secret := fields[4]
	keys := map[string]bool{}
	for _, f := range fields[5:] {
		if k, ok := strings.CutPrefix(f, "--from-file="); ok {
			k, _, _ = strings.Cut(k, "=")
			keys[filepath.Base(k)] = true
			if _, err := os.Stat(filepath.Join(root, "envoy/secrets", filepath.Base(k)+".example")); err != nil {
				t.Errorf("%s has no example in envoy/secrets", k)
			}
		}
	}
	envoyCfg, err := os.ReadFile(filepath.Join(root, "deploy/helm/fusebox/files/envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`/etc/envoy/secrets/([\w.-]+)`).FindAllStringSubmatch(string(envoyCfg), -1) {
		if !keys[m[1]] {
			t.Errorf("Envoy reads %s, which the README's Secret lacks", m[1])
		}
	}

	// helm install RELEASE CHART --set k=v ...
	values := map[string]any{}
	hf := strings.Fields(strings.ReplaceAll(helm, "$(openssl rand -hex 24)", "0123456789abcdef0123456789abcdef0123456789abcdef"))
	if len(hf) < 4 || hf[3] != "deploy/helm/fusebox" {
		t.Fatalf("the helm line installs no chart of ours: %s", helm)
	}
	for i := 0; i < len(hf); i++ {
		if hf[i] == "--set" && i+1 < len(hf) {
			if err := strvals.ParseInto(hf[i+1], values); err != nil {
				t.Fatalf("--set %s: %v", hf[i+1], err)
			}
		}
	}
	out, err := render(t, values)
	if err != nil {
		t.Fatalf("the chart does not render with the README's values: %v", err)
	}
	byKind := docs(t, out)
	var dep appsv1.Deployment
	if len(byKind["Deployment"]) != 1 {
		t.Fatalf("%d Deployments", len(byKind["Deployment"]))
	}
	if err := yaml.UnmarshalStrict(byKind["Deployment"][0], &dep); err != nil {
		t.Fatal(err)
	}
	var images []string
	mounted := false
	for _, c := range dep.Spec.Template.Spec.Containers {
		images = append(images, c.Image)
	}
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == secret {
			mounted = true
		}
	}
	if !strings.Contains(strings.Join(images, " "), image[1]) {
		t.Errorf("the pod runs %v, not the image built (%s)", images, image[1])
	}
	if !mounted {
		t.Errorf("the pod mounts no Secret %q", secret)
	}
}
