package driver

import (
	"context"
	"io"
)

// BuildIDPrefix starts the id of every build sandbox (ImageBuilder), so
// that what a crashed build left (its sandbox, its egress network, keyed
// by that id) is told from a session's sandbox by its id alone: a build
// sandbox is never listed by List, never a session's, never reported.
const BuildIDPrefix = "corral-build-"

// ImageBuilder is implemented by the drivers that build and move images
// (the containerd driver). A driver that cannot build (not gVisor) answers
// BuildImage with an error of kind unimplemented.
type ImageBuilder interface {
	// Image returns the image called name on this host: its manifest
	// digest and the compressed size of its last layer (a built image's
	// committed one); kind not found if there is none.
	Image(ctx context.Context, name string) (BuiltImage, error)
	// BuildImage runs spec's steps, in order and as root, in a build
	// sandbox of spec.BaseImage and commits what they changed in its
	// root file system as one layer on it: an image named spec.Ref,
	// unpacked like any other. A step that exits non-zero is an error of
	// kind failed precondition naming it and the tail of its output; the
	// end of ctx (the build's timeout) its error; on any error nothing is
	// committed. The build sandbox and its snapshot are removed before it
	// returns, whatever happens.
	BuildImage(ctx context.Context, spec BuildSpec) (BuiltImage, error)
	// ExportImage writes an OCI image layout tar holding image name alone
	// to w; an image whose content is over max bytes (max > 0) is refused
	// with kind resource exhausted before anything is written, and w
	// never receives more than max bytes.
	ExportImage(ctx context.Context, name string, max int64, w io.Writer) error
	// ImportImage imports an archive ExportImage wrote, which must hold
	// image name and no other (kind invalid argument otherwise, and then
	// nothing of it is kept), unpacks it and returns its manifest digest.
	// An image of that name already present is replaced by the archive's.
	ImportImage(ctx context.Context, name string, archive io.ReadSeeker) (string, error)
	// RemoveImage removes an image BuildImage made or ImportImage brought,
	// and its content once nothing else holds it; an image that is not
	// there is not an error, any other is refused (kind failed
	// precondition).
	RemoveImage(ctx context.Context, name string) error
}

// BuildSpec is one image build.
type BuildSpec struct {
	// Ref names the image made; BaseImage is the image built on, which
	// must be present.
	Ref, BaseImage string
	Steps          []BuildStep
	// Limits bound the build sandbox; zero fields take the driver's
	// defaults. DiskBytes bounds what the steps write (the layer).
	Limits Limits
	// Network, if set, is called with the build sandbox's id before the
	// sandbox is made, and returns the network namespace it joins and the
	// variables its commands need (the egress network's proxy). The
	// caller removes that network once BuildImage has returned. Nil: no
	// network (loopback only).
	Network func(ctx context.Context, id string) (namespace string, env map[string]string, err error)
	// Output receives each step's output as it is produced (standard
	// output and error merged), preceded by a line naming the step. It is
	// written from one goroutine at a time.
	Output io.Writer
}

// BuildStep is one command of a build.
type BuildStep struct {
	// Name is for the log and errors ("apt").
	Name string
	// Command is argv, looked up on the build sandbox's PATH.
	Command []string
	// Env is added to the build sandbox's environment for this step.
	Env map[string]string
	// Files are written (root's, mode 0644, parent directories made)
	// before the command runs, by absolute path in the image.
	Files map[string][]byte
}

// BuiltImage is a build's outcome.
type BuiltImage struct {
	// Digest is the image's manifest digest ("sha256:...").
	Digest string
	// LayerBytes is the committed layer's compressed size.
	LayerBytes int64
}
