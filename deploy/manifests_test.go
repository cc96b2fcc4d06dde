package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	composetypes "github.com/compose-spec/compose-go/v2/types"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"credbroker/vault"
)

// kubeObjects are the manifests under deploy/kubernetes, decoded.
type kubeObjects struct {
	deployment *appsv1.Deployment
	service    *corev1.Service
	pdb        *policyv1.PodDisruptionBudget
	configMap  *corev1.ConfigMap
	ingress    *networkingv1.Ingress
}

// decodeKubernetes decodes every document of every deploy/kubernetes/*.yaml
// strictly into its Kubernetes API type (k8s.io/api): a field the type does
// not have, a duplicate field or a wrong value type is an error, as with
// `kubectl apply --validate=strict`. Kinds other than the expected ones are
// errors too.
func decodeKubernetes(t *testing.T) kubeObjects {
	t.Helper()
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests under deploy/kubernetes: %v", err)
	}
	var objs kubeObjects
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range splitYAMLDocuments(src) {
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				t.Errorf("%s#%d: %v", f, i, err)
				continue
			}
			var into any
			switch tm.APIVersion + " " + tm.Kind {
			case "apps/v1 Deployment":
				objs.deployment = &appsv1.Deployment{}
				into = objs.deployment
			case "v1 Service":
				objs.service = &corev1.Service{}
				into = objs.service
			case "policy/v1 PodDisruptionBudget":
				objs.pdb = &policyv1.PodDisruptionBudget{}
				into = objs.pdb
			case "v1 ConfigMap":
				objs.configMap = &corev1.ConfigMap{}
				into = objs.configMap
			case "networking.k8s.io/v1 Ingress":
				objs.ingress = &networkingv1.Ingress{}
				into = objs.ingress
			default:
				t.Errorf("%s#%d: unexpected kind %q %q", f, i, tm.APIVersion, tm.Kind)
				continue
			}
			if err := decodeStrict(doc, into); err != nil {
				t.Errorf("%s#%d (%s): %v", f, i, tm.Kind, err)
			}
		}
	}
	if objs.deployment == nil || objs.service == nil || objs.pdb == nil || objs.configMap == nil || objs.ingress == nil {
		t.Fatalf("want a Deployment, Service, PodDisruptionBudget, ConfigMap and Ingress; got %+v", objs)
	}
	return objs
}

// decodeStrict decodes one YAML document into a Kubernetes API object the
// way the API server's strict field validation does: YAML to JSON with
// duplicate keys refused, then sigs.k8s.io/json, which matches field names
// case-sensitively (encoding/json, and so sigs.k8s.io/yaml.UnmarshalStrict,
// would take readOnlyRootFileSystem for readOnlyRootFilesystem) and reports
// unknown and duplicate fields.
func decodeStrict(doc []byte, into any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(j, into, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// splitYAMLDocuments splits a YAML stream at `---` lines, dropping empty
// documents.
func splitYAMLDocuments(src []byte) [][]byte {
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(src), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(d, "")) != "" {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

// TestStrictDecodeRejectsUnknownFields: the decoding the manifest tests rely
// on fails on a misspelt field (wrong case included), a duplicate field and
// a wrong value type, so a typo cannot pass as valid.
func TestStrictDecodeRejectsUnknownFields(t *testing.T) {
	for _, doc := range []string{
		"apiVersion: apps/v1\nkind: Deployment\nspec:\n  replica: 2\n",
		"apiVersion: apps/v1\nkind: Deployment\nspec:\n  template:\n    spec:\n      containers:\n        - name: a\n          securityContext:\n            readOnlyRootFileSystem: true\n",
		"apiVersion: apps/v1\nkind: Deployment\nspec:\n  replicas: 2\n  replicas: 3\n",
		"apiVersion: apps/v1\nkind: Deployment\nspec:\n  replicas: two\n",
		"apiVersion: apps/v1\nkind: Deployment\nspec:\n  template:\n    metadata:\n      annotations:\n        prometheus.io/port: 9090\n",
	} {
		if err := decodeStrict([]byte(doc), &appsv1.Deployment{}); err == nil {
			t.Errorf("strict decoding accepted:\n%s", doc)
		}
	}
}

// TestKubernetesManifests decodes the manifests strictly and checks what
// docs/DEPLOY.md promises: two replicas on PostgreSQL over TLS, probes on
// /healthz and /readyz, a locked-down securityContext, secrets by reference
// only, /metrics annotated on its own port, and a Service, PDB and Ingress
// that select the same pods. Then it runs `broker serve --check-config`
// with the pod's environment, arguments and mounted files, so every flag,
// variable and the provider catalogue are the real broker's.
func TestKubernetesManifests(t *testing.T) {
	objs := decodeKubernetes(t)
	d := objs.deployment
	pod := d.Spec.Template.Spec
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas %v, want 2", d.Spec.Replicas)
	}
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("the Deployment's selector %v does not select its pods %v", d.Spec.Selector, d.Spec.Template.Labels)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("want one container, got %d", len(pod.Containers))
	}
	c := pod.Containers[0]
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		if _, dup := env[e.Name]; dup {
			t.Errorf("env %s set twice", e.Name)
		}
		env[e.Name] = e
	}

	// Security context: pod and container.
	psc, csc := pod.SecurityContext, c.SecurityContext
	if psc == nil || csc == nil {
		t.Fatal("pod and container need a securityContext")
	}
	if psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != imageUID ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v: want runAsNonRoot, runAsUser %d, seccomp RuntimeDefault", psc, imageUID)
	}
	if csc.RunAsNonRoot == nil || !*csc.RunAsNonRoot || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation ||
		csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem || csc.Capabilities == nil ||
		!slices.Equal(csc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(csc.Capabilities.Add) != 0 ||
		csc.SeccompProfile == nil || csc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("container securityContext: want runAsNonRoot, allowPrivilegeEscalation false, readOnlyRootFilesystem, capabilities drop ALL, seccomp RuntimeDefault")
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("the broker needs no Kubernetes API token: automountServiceAccountToken: false")
	}

	// Ports and probes.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	probe := func(name string, p *corev1.Probe, path string) {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path || ports[p.HTTPGet.Port.String()] != 8080 {
			t.Errorf("%s probe: want GET %s on the http port (8080), got %+v", name, path, p)
		}
	}
	probe("liveness", c.LivenessProbe, "/healthz")
	probe("readiness", c.ReadinessProbe, "/readyz")
	if c.StartupProbe != nil {
		probe("startup", c.StartupProbe, "/healthz")
	}
	if rp := c.ReadinessProbe; rp != nil && rp.TimeoutSeconds <= 3 {
		t.Errorf("readiness timeout %ds: /readyz may take its 3 s IdP check; give it more", rp.TimeoutSeconds)
	}

	// Metrics on their own port, annotated for scraping.
	ann := d.Spec.Template.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/path"] != "/metrics" ||
		ann["prometheus.io/port"] != fmt.Sprint(ports["metrics"]) || !strings.HasSuffix(env["BROKER_METRICS_ADDR"].Value, fmt.Sprintf(":%d", ports["metrics"])) {
		t.Errorf("metrics: annotations %v, port %d, BROKER_METRICS_ADDR %q: want /metrics scraped on the metrics port the broker serves it on",
			ann, ports["metrics"], env["BROKER_METRICS_ADDR"].Value)
	}

	// The store is PostgreSQL (a bbolt file cannot be shared by replicas)
	// and its password is not in the URL.
	store := env["BROKER_STORE"].Value
	if !strings.HasPrefix(store, "postgres://") || strings.Contains(store, ":@") || regexp.MustCompile(`//[^/@]*:[^/@]*@`).MatchString(store) || !strings.Contains(store, "sslmode=verify-full") {
		t.Errorf("BROKER_STORE %q: want postgres://user@host/db?sslmode=verify-full without a password", store)
	}

	// Secrets by reference only: literal values only for names that are not
	// secret; every secret key comes from the Secret the docs create.
	secretKeys := map[string]bool{}
	for name, e := range env {
		if e.ValueFrom != nil {
			if e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != "credbroker" {
				t.Errorf("env %s: want a secretKeyRef to the Secret credbroker", name)
				continue
			}
			secretKeys[e.ValueFrom.SecretKeyRef.Key] = true
			continue
		}
		if looksSecret(name) && !strings.HasSuffix(name, "_FILE") {
			t.Errorf("env %s has a literal value; secrets come from the Secret by reference", name)
		}
	}
	var secretVolume *corev1.SecretVolumeSource
	for _, v := range pod.Volumes {
		if v.Secret != nil {
			secretVolume = v.Secret
			if v.Secret.SecretName != "credbroker" || v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o007 != 0 {
				t.Errorf("secret volume %s: want the Secret credbroker with no access for others", v.Name)
			}
			for _, it := range v.Secret.Items {
				secretKeys[it.Key] = true
			}
		}
	}
	if secretVolume == nil {
		t.Error("no Secret volume: keys and the client secret are files from the Secret")
	}
	checkDocumentedSecretKeys(t, secretKeys)

	// Service, PodDisruptionBudget and Ingress select these pods.
	svc := objs.service
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("the Service selects %v, not the broker's pods", svc.Spec.Selector)
	}
	var svcPort *corev1.ServicePort
	for i, p := range svc.Spec.Ports {
		if p.TargetPort.Type == intstr.String && ports[p.TargetPort.StrVal] == 0 {
			t.Errorf("the Service targets port %q, which the container does not name", p.TargetPort.StrVal)
		}
		if p.TargetPort.StrVal == "metrics" || p.TargetPort.IntVal == ports["metrics"] {
			t.Errorf("the Service exposes the metrics port")
		}
		if p.Name == "http" {
			svcPort = &svc.Spec.Ports[i]
		}
	}
	if svcPort == nil {
		t.Error("the Service has no port named http")
	}
	pdb := objs.pdb
	pdbSel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil || !pdbSel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("the PodDisruptionBudget selects %v, not the broker's pods", pdb.Spec.Selector)
	}
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() < 1 || pdb.Spec.MinAvailable.IntValue() >= int(*d.Spec.Replicas) {
		t.Errorf("PodDisruptionBudget minAvailable %v: want at least 1 and fewer than the replicas", pdb.Spec.MinAvailable)
	}
	ing := objs.ingress
	if len(ing.Spec.TLS) == 0 || len(ing.Spec.Rules) == 0 {
		t.Fatal("the Ingress must terminate TLS for the public URL")
	}
	publicHost := strings.TrimPrefix(env["BROKER_PUBLIC_URL"].Value, "https://")
	if ing.Spec.Rules[0].Host != publicHost || !slices.Contains(ing.Spec.TLS[0].Hosts, publicHost) {
		t.Errorf("Ingress host %q / TLS %v, want the public URL's host %q", ing.Spec.Rules[0].Host, ing.Spec.TLS[0].Hosts, publicHost)
	}
	for _, r := range ing.Spec.Rules {
		for _, p := range r.HTTP.Paths {
			if b := p.Backend.Service; b == nil || b.Name != svc.Name || (svcPort != nil && b.Port.Name != svcPort.Name) {
				t.Errorf("Ingress path %s routes to %+v, want the Service %s port http", p.Path, p.Backend.Service, svc.Name)
			}
		}
	}

	// The broker accepts this configuration: run `broker serve
	// --check-config` with the pod's environment, arguments and files.
	files := map[string]string{} // path in the container -> content
	var mounts []string
	for _, m := range c.VolumeMounts {
		mounts = append(mounts, m.MountPath)
		for _, v := range pod.Volumes {
			if v.Name != m.Name {
				continue
			}
			switch {
			case v.Secret != nil:
				for _, it := range v.Secret.Items {
					files[m.MountPath+"/"+it.Path] = "test-" + it.Key
				}
			case v.ConfigMap != nil:
				if v.ConfigMap.Name != objs.configMap.Name {
					t.Errorf("volume %s mounts ConfigMap %s, which is not among the manifests", v.Name, v.ConfigMap.Name)
				}
				for k, val := range objs.configMap.Data {
					files[m.MountPath+"/"+k] = val
				}
			}
		}
	}
	vars := imageEnv(t)
	for name, e := range env {
		if e.ValueFrom != nil {
			vars[name] = "test-" + e.ValueFrom.SecretKeyRef.Key
		} else {
			vars[name] = e.Value
		}
	}
	out := checkConfig(t, vars, append(slices.Clone(c.Command), c.Args...), files, mounts)
	if !strings.Contains(out, "configuration OK: 1 provider(s): github") {
		t.Errorf("broker serve --check-config: %s", out)
	}
}

// TestComposeFile loads deploy/compose/compose.yaml with compose-go, the
// loader Docker Compose itself uses: the file is checked against the
// Compose specification's JSON schema (unknown keys are errors) and
// resolved into a project. Then the broker service is checked (hardened,
// secrets as files, PostgreSQL before it starts) and `broker serve
// --check-config` runs with its environment, command and files.
func TestComposeFile(t *testing.T) {
	dir, err := filepath.Abs("compose")
	if err != nil {
		t.Fatal(err)
	}
	project := loadCompose(t, dir, "compose.yaml")
	broker, ok := project.Services["broker"]
	if !ok {
		t.Fatalf("no broker service; services: %v", project.ServiceNames())
	}
	pg, ok := project.Services["postgres"]
	if !ok {
		t.Fatal("no postgres service")
	}
	if !broker.ReadOnly || !slices.Equal(broker.CapDrop, []string{"ALL"}) || !slices.Contains(broker.SecurityOpt, "no-new-privileges:true") {
		t.Errorf("broker service: want read_only, cap_drop [ALL], security_opt no-new-privileges:true; got %v %v %v", broker.ReadOnly, broker.CapDrop, broker.SecurityOpt)
	}
	if broker.User != "" && broker.User != imageUser {
		t.Errorf("broker user %q: leave the image's non-root user", broker.User)
	}
	if dep, ok := broker.DependsOn["postgres"]; !ok || dep.Condition != composetypes.ServiceConditionHealthy || pg.HealthCheck == nil {
		t.Errorf("the broker must wait for a healthy PostgreSQL: depends_on %v, healthcheck %v", broker.DependsOn, pg.HealthCheck)
	}
	for _, p := range broker.Ports {
		if p.HostIP != "127.0.0.1" {
			t.Errorf("port %s published on %q: publish on 127.0.0.1 for the TLS-terminating proxy", p.Published, p.HostIP)
		}
		if p.Target != 8080 {
			t.Errorf("published container port %d: only the broker's 8080 (not metrics)", p.Target)
		}
	}
	if len(pg.Ports) != 0 {
		t.Errorf("PostgreSQL is published on the host: %v", pg.Ports)
	}

	vars := imageEnv(t)
	for name, v := range broker.Environment {
		if v == nil {
			t.Errorf("environment %s has no value", name)
			continue
		}
		if looksSecret(name) && !strings.HasSuffix(name, "_FILE") {
			t.Errorf("environment %s holds a secret value; use a Compose secret file", name)
		}
		vars[name] = *v
	}
	if !strings.HasPrefix(vars["BROKER_STORE"], "postgres") {
		t.Errorf("BROKER_STORE %q: want the PostgreSQL service", vars["BROKER_STORE"])
	}
	files := map[string]string{}
	mounts := []string{"/run/secrets/"}
	for _, s := range broker.Secrets {
		if _, ok := project.Secrets[s.Source]; !ok {
			t.Errorf("secret %s is not defined", s.Source)
		}
		target := s.Target
		if target == "" {
			target = "/run/secrets/" + s.Source
		}
		if !strings.HasPrefix(target, "/run/secrets/") {
			target = "/run/secrets/" + target
		}
		files[target] = "test-" + s.Source
	}
	for _, c := range broker.Configs {
		cfg, ok := project.Configs[c.Source]
		if !ok {
			t.Fatalf("config %s is not defined", c.Source)
		}
		b, err := os.ReadFile(cfg.File)
		if err != nil {
			t.Fatalf("config %s: %v", c.Source, err)
		}
		files[c.Target] = string(b)
		mounts = append(mounts, c.Target)
	}
	out := checkConfig(t, vars, append(slices.Clone(broker.Entrypoint), broker.Command...), files, mounts)
	if !strings.Contains(out, "configuration OK: 1 provider(s): github") {
		t.Errorf("broker serve --check-config: %s", out)
	}
}

// TestComposeSchemaRejectsUnknownKeys: the Compose check fails on a
// misspelt key, so a typo cannot pass as valid.
func TestComposeSchemaRejectsUnknownKeys(t *testing.T) {
	dir := t.TempDir()
	bad := "services:\n  broker:\n    image: localhost/credbroker:dev\n    readonly: true\n"
	if err := os.WriteFile(filepath.Join(dir, "compose.yaml"), []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	details := composetypes.ConfigDetails{WorkingDir: dir, ConfigFiles: []composetypes.ConfigFile{{Filename: filepath.Join(dir, "compose.yaml")}}, Environment: composetypes.Mapping{}}
	_, err := loader.LoadWithContext(context.Background(), details, func(o *loader.Options) { o.SetProjectName("t", true) })
	if err == nil || !strings.Contains(err.Error(), "readonly") {
		t.Errorf("compose-go accepted an unknown key: %v", err)
	}
}

func loadCompose(t *testing.T, dir, file string) *composetypes.Project {
	t.Helper()
	details := composetypes.ConfigDetails{
		WorkingDir:  dir,
		ConfigFiles: []composetypes.ConfigFile{{Filename: filepath.Join(dir, file)}},
		// No variables from this machine's environment leak into the check.
		Environment: composetypes.Mapping{},
	}
	project, err := loader.LoadWithContext(context.Background(), details)
	if err != nil {
		t.Fatalf("compose-go: %v", err)
	}
	return project
}

// looksSecret reports whether an environment variable's name says it holds
// a secret value.
func looksSecret(name string) bool {
	return regexp.MustCompile(`SECRET|PASSWORD|KEYS|TOKEN`).MatchString(name)
}

// checkDocumentedSecretKeys: every Secret key the manifests use is created
// by the `kubectl create secret` command in docs/DEPLOY.md, and the command
// creates nothing they do not use.
func checkDocumentedSecretKeys(t *testing.T, used map[string]bool) {
	t.Helper()
	doc, err := os.ReadFile("../docs/DEPLOY.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile(`--from-(?:file|literal)=([a-z0-9-]+)=`).FindAllStringSubmatch(string(doc), -1) {
		documented[m[1]] = true
	}
	for k := range used {
		if !documented[k] {
			t.Errorf("the manifests use Secret key %q, which docs/DEPLOY.md's kubectl create secret does not create", k)
		}
	}
	for k := range documented {
		if !used[k] {
			t.Errorf("docs/DEPLOY.md creates Secret key %q, which no manifest uses", k)
		}
	}
}

// imageEnv is the environment the image sets (its Dockerfile's ENV).
func imageEnv(t *testing.T) map[string]string {
	t.Helper()
	src, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	stages := parseDockerfile(string(src))
	env := map[string]string{}
	for _, in := range stages[len(stages)-1].instrs {
		if in.cmd == "ENV" {
			for _, kv := range strings.Fields(in.args) {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
			}
		}
	}
	return env
}

var (
	brokerOnce sync.Once
	brokerBin  string
	brokerErr  error
)

// brokerBinary builds cmd/broker once for the tests in this package.
func brokerBinary(t *testing.T) string {
	t.Helper()
	brokerOnce.Do(func() {
		dir, err := os.MkdirTemp("", "credbroker-deploy-")
		if err != nil {
			brokerErr = err
			return
		}
		brokerBin = filepath.Join(dir, "broker")
		cmd := exec.Command("go", "build", "-o", brokerBin, "./cmd/broker")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			brokerErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if brokerErr != nil {
		t.Fatal(brokerErr)
	}
	return brokerBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if brokerBin != "" {
		os.RemoveAll(filepath.Dir(brokerBin))
	}
	os.Exit(code)
}

// checkConfig runs `broker serve --check-config` as the container would
// run it: with only env as its environment, args after `serve`, and files
// (container path -> content) placed under a temporary root. Every
// container path under one of mounts, in env values, args and the files'
// contents, is moved under that root. The keys file (BROKER_KEYS_FILE)
// gets a real key. It returns the combined output and fails the test on a
// non-zero exit.
func checkConfig(t *testing.T, env map[string]string, args []string, files map[string]string, mounts []string) string {
	t.Helper()
	root := t.TempDir()
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	var pairs []string
	for _, m := range mounts {
		pairs = append(pairs, m, root+m)
	}
	move := strings.NewReplacer(pairs...)
	if kf := env["BROKER_KEYS_FILE"]; kf != "" {
		if _, ok := files[kf]; !ok {
			t.Errorf("BROKER_KEYS_FILE %s is not among the mounted files", kf)
		}
		files[kf] = vault.GenerateKey() + "\n"
	}
	if sf := env["BROKER_CLIENT_SECRET_FILE"]; sf != "" {
		if _, ok := files[sf]; !ok {
			t.Errorf("BROKER_CLIENT_SECRET_FILE %s is not among the mounted files", sf)
		}
	}
	for p, content := range files {
		host := root + p
		if err := os.MkdirAll(filepath.Dir(host), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(host, []byte(move.Replace(content)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	environ := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + root}
	for k, v := range env {
		environ = append(environ, k+"="+move.Replace(v))
	}
	argv := []string{"serve", "--check-config"}
	for _, a := range args {
		argv = append(argv, move.Replace(a))
	}
	if len(args) > 0 && (args[0] == "/broker" || args[0] == "serve") {
		t.Errorf("the command %v repeats the entrypoint: the image's entrypoint is already %q", args, imageEntrypoint)
	}
	cmd := exec.Command(brokerBinary(t), argv...)
	cmd.Env = environ
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Errorf("broker %s: %v\n%s", strings.Join(argv, " "), err, out.String())
	}
	return out.String()
}
