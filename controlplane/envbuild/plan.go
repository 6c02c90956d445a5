package envbuild

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"regexp"

	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Packages are an environment's package lists, as the API's packages
// object names them.
type Packages struct {
	Apt   []string `json:"apt,omitempty"`
	Cargo []string `json:"cargo,omitempty"`
	Gem   []string `json:"gem,omitempty"`
	Go    []string `json:"go,omitempty"`
	Npm   []string `json:"npm,omitempty"`
	Pip   []string `json:"pip,omitempty"`
}

// Lists returns each manager's list, in Managers' order.
func (p Packages) Lists() [][]string {
	return [][]string{p.Apt, p.Cargo, p.Gem, p.Go, p.Npm, p.Pip}
}

// Empty reports whether no manager has a package.
func (p Packages) Empty() bool {
	for _, l := range p.Lists() {
		if len(l) > 0 {
			return false
		}
	}
	return true
}

// What a package may be, per manager: a name, optionally a version, never
// a URL, a path or an option (a build step passes each as one argument,
// never through a shell, but a manager reads "./x", "git+https://..." or
// "--index-url" as more than a package). The shapes are each manager's
// own: apt "name[:arch][=version]", pip a requirement with extras and
// version clauses, npm "[@scope/]name[@range]", cargo "name[@version]",
// gem "name[:version]", go "module/path@version".
var packageShapes = map[string]*regexp.Regexp{
	"apt":   regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]*(:[a-z0-9-]+)?(=[A-Za-z0-9.+~:-]+)?$`),
	"pip":   regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?((==|>=|<=|~=|!=|===|<|>)[A-Za-z0-9.*+!_-]+)?(,(==|>=|<=|~=|!=|<|>)[A-Za-z0-9.*+!_-]+)*$`),
	"npm":   regexp.MustCompile(`^(@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*(@[A-Za-z0-9.^~<>=*+_-]+)?$`),
	"cargo": regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]*(@[A-Za-z0-9.^~<>=*+-]+)?$`),
	"gem":   regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*(:[A-Za-z0-9.]+)?$`),
	"go":    regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._~/-]*@[A-Za-z0-9._+-]+$`),
}

// Validate checks each package's shape and that its manager has a
// mirror: what corral cannot install it refuses, before anything is
// stored.
func Validate(p Packages, m Mirrors) error {
	for i, list := range p.Lists() {
		manager := Managers[i]
		if len(list) == 0 {
			continue
		}
		if _, ok := m[manager]; !ok {
			return errNoMirror(manager, m)
		}
		for j, name := range list {
			if !packageShapes[manager].MatchString(name) {
				return errdefs.InvalidArgument("config.packages.%s[%d]: %q is not a %s package name (a name, optionally with a version; never a URL, a path or an option)", manager, j, clip(name), manager)
			}
		}
	}
	return nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// keyVersion changes whenever Plan's steps change for the same input, so
// no image built by older steps is taken for a newer build.
const keyVersion = 1

// Key is a build's content key: the SHA-256 (hex) of everything its image
// depends on. Builds of one tenant with one key are one build; another
// tenant's identical packages build apart (no tenant learns from a cache
// what another installed).
func Key(tenantID, baseImage string, p Packages, m Mirrors) string {
	used := map[string]string{}
	for i, l := range p.Lists() {
		if len(l) > 0 {
			used[Managers[i]] = m[Managers[i]].Spec
		}
	}
	b, _ := json.Marshal(struct {
		V        int               `json:"v"`
		Tenant   string            `json:"tenant"`
		Base     string            `json:"base"`
		Packages Packages          `json:"packages"`
		Mirrors  map[string]string `json:"mirrors"`
	}{keyVersion, tenantID, baseImage, p, used})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// ImagePrefix starts the name of every image a build makes.
const ImagePrefix = "corral.build/packages:"

// ImageRef is the name of the image a build of key makes.
func ImageRef(key string) string { return ImagePrefix + key }

// aptSources is where the apt step writes the mirror's sources entry. apt
// is pointed at it alone (Dir::Etc::SourceList), so the image's own
// sources, which the build sandbox cannot reach, are not read; it is
// removed at the end of the step.
const aptSources = "/etc/apt/corral-mirror.list"

// aptScript installs "$@" from the mirror alone and leaves no lists,
// archives or mirror entry in the layer.
const aptScript = `set -e
parts=$(mktemp -d)
o="-o Dir::Etc::SourceList=` + aptSources + ` -o Dir::Etc::SourceParts=$parts"
apt-get $o update
apt-get $o install -y --no-install-recommends "$@"
apt-get clean
rm -rf /var/lib/apt/lists/* "$parts" ` + aptSources

// needTool runs argv if the base image has tool, and otherwise fails the
// step saying what is missing (the image is the operator's choice).
const needTool = `command -v "$1" >/dev/null 2>&1 || { echo "$1 is not in the environment's base image, and packages.$2 need it" >&2; exit 127; }
shift 2
exec "$@"`

func withTool(tool, manager string, argv ...string) []string {
	return append([]string{"sh", "-c", needTool, "corral-build", tool, manager}, argv...)
}

// Plan returns the steps that install p from m, one per manager with
// packages, in Managers' order (apt first: the others' tools may come
// from it). Validate must have accepted p.
func Plan(p Packages, m Mirrors) []*pb.BuildStep {
	var steps []*pb.BuildStep
	if len(p.Apt) > 0 {
		steps = append(steps, &pb.BuildStep{
			Name:    "apt",
			Files:   map[string][]byte{aptSources: []byte("deb " + m["apt"].Spec + "\n")},
			Env:     map[string]string{"DEBIAN_FRONTEND": "noninteractive"},
			Command: withTool("apt-get", "apt", append([]string{"sh", "-c", aptScript, "apt"}, p.Apt...)...),
		})
	}
	if len(p.Cargo) > 0 {
		argv := []string{"cargo", "install", "--locked", "--root", "/usr/local", "--index", "sparse+" + m["cargo"].URL}
		steps = append(steps, &pb.BuildStep{Name: "cargo", Command: withTool("cargo", "cargo", append(argv, p.Cargo...)...)})
	}
	if len(p.Gem) > 0 {
		argv := []string{"gem", "install", "--no-document", "--clear-sources", "--source", m["gem"].URL}
		steps = append(steps, &pb.BuildStep{Name: "gem", Command: withTool("gem", "gem", append(argv, p.Gem...)...)})
	}
	if len(p.Go) > 0 {
		// The mirror is a module proxy; the checksum database is not
		// reachable from the build sandbox, so the proxy is trusted for
		// sums as it is for modules.
		argv := []string{"go", "install"}
		steps = append(steps, &pb.BuildStep{Name: "go",
			Env:     map[string]string{"GOPROXY": m["go"].URL, "GOSUMDB": "off", "GOBIN": "/usr/local/bin", "GOFLAGS": "-modcacherw", "GOPATH": "/tmp/corral-go"},
			Command: withTool("go", "go", append(argv, p.Go...)...)})
	}
	if len(p.Npm) > 0 {
		argv := []string{"npm", "install", "--global", "--no-audit", "--no-fund", "--no-update-notifier", "--registry", m["npm"].URL}
		steps = append(steps, &pb.BuildStep{Name: "npm", Command: withTool("npm", "npm", append(argv, p.Npm...)...)})
	}
	if len(p.Pip) > 0 {
		// Installed into the image's Python, which the image's own pip
		// (Debian's) marks externally managed: the image is the
		// environment's own, so that is what is wanted.
		argv := []string{"python3", "-m", "pip", "install", "--no-cache-dir", "--no-input", "--break-system-packages", "--index-url", m["pip"].URL}
		steps = append(steps, &pb.BuildStep{Name: "pip",
			Env:     map[string]string{"PIP_DISABLE_PIP_VERSION_CHECK": "1"},
			Command: withTool("python3", "pip", append(argv, p.Pip...)...)})
	}
	return steps
}
