package containerd

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"io"
	"path"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/images/archive"
	"github.com/containerd/containerd/v2/core/leases"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"corral.dev/corral/internal/errdefs"
)

// exportOverhead is what an export's archive adds to its blobs' sizes: the
// tar headers, oci-layout and index.json (bytes; generous).
const exportOverhead = 64 << 10

// ExportImage implements driver.ImageBuilder: the image's manifest for
// this host's platform, its config and layers, as an OCI image layout tar
// (containerd's exporter), the image's name annotated on its manifest.
func (d *Driver) ExportImage(ctx context.Context, name string, max int64, w io.Writer) error {
	ctx = d.ns(ctx)
	is, cs := d.client.ImageService(), d.client.ContentStore()
	img, err := is.Get(ctx, name)
	if cerrdefs.IsNotFound(err) {
		return errdefs.NotFound("image %q is not present on this host", name)
	}
	if err != nil {
		return kindOf(err, "exporting image %q", name)
	}
	m, err := images.Manifest(ctx, cs, img.Target, platforms.Default())
	if err != nil {
		return kindOf(err, "exporting image %q: its manifest", name)
	}
	size := img.Target.Size + m.Config.Size + exportOverhead
	for _, l := range m.Layers {
		size += l.Size + 1024
	}
	if max > 0 && size > max {
		return errdefs.ResourceExhausted("image %q is about %d bytes, over the export bound of %d", name, size, max)
	}
	if max > 0 {
		w = &limitWriter{w: w, left: max}
	}
	err = d.client.Export(ctx, w, archive.WithImage(is, name), archive.WithPlatform(platforms.DefaultStrict()), archive.WithSkipDockerManifest())
	if err != nil {
		return kindOf(err, "exporting image %q", name)
	}
	return nil
}

// limitWriter fails a write past its bound.
type limitWriter struct {
	w    io.Writer
	left int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.left {
		return 0, errdefs.ResourceExhausted("the export outgrew its bound")
	}
	n, err := l.w.Write(p)
	l.left -= int64(n)
	return n, err
}

// ImportImage implements driver.ImageBuilder. The archive is read twice:
// first its index.json alone (the tar's headers are skipped by seeking),
// which must name exactly one manifest, image name's; only then is it
// imported, with no other name accepted.
func (d *Driver) ImportImage(ctx context.Context, name string, r io.ReadSeeker) (string, error) {
	ctx = d.ns(ctx)
	want, err := archiveManifest(r, name)
	if err != nil {
		return "", err
	}
	if _, err := r.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	ctx, done, err := d.client.WithLease(ctx, leases.WithRandomID())
	if err != nil {
		return "", kindOf(err, "importing image %q: lease", name)
	}
	defer done(context.WithoutCancel(ctx))
	imgs, err := d.client.Import(ctx, r,
		client.WithImageRefTranslator(func(s string) string {
			if s == name {
				return s
			}
			return ""
		}),
		client.WithImportPlatform(platforms.Default()))
	if err != nil {
		return "", errdefs.Wrap(errdefs.InvalidArgumentKind, err, "importing image %q", name)
	}
	var got *images.Image
	for i := range imgs {
		if imgs[i].Name == name {
			got = &imgs[i]
		} else {
			// Not possible after the check; never kept.
			_ = d.client.ImageService().Delete(ctx, imgs[i].Name)
		}
	}
	if got == nil || got.Target.Digest != want.Digest {
		return "", errdefs.InvalidArgument("importing image %q: the archive does not hold it", name)
	}
	if err := client.NewImage(d.client, *got).Unpack(ctx, d.cfg.Snapshotter); err != nil {
		return "", kindOf(err, "importing image %q: unpacking", name)
	}
	// Labelled as a build's: RemoveImage may remove it, as it may the
	// image on the host that built it.
	got.Labels = map[string]string{labelBuild: "1"}
	if _, err := d.client.ImageService().Update(ctx, *got, "labels."+labelBuild); err != nil {
		return "", kindOf(err, "importing image %q: labelling it", name)
	}
	return got.Target.Digest.String(), nil
}

// archiveManifest reads an OCI layout tar's index.json and returns its one
// manifest, which must be named name.
func archiveManifest(r io.Reader, name string) (ocispec.Descriptor, error) {
	tr := tar.NewReader(r)
	var idx *ocispec.Index
	layout := false
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return ocispec.Descriptor{}, errdefs.InvalidArgument("importing image %q: not a tar archive: %v", name, err)
		}
		switch path.Clean(h.Name) {
		case ocispec.ImageLayoutFile:
			layout = true
		case ocispec.ImageIndexFile:
			if idx != nil {
				return ocispec.Descriptor{}, errdefs.InvalidArgument("importing image %q: the archive has two index.json", name)
			}
			if h.Size > 1<<20 {
				return ocispec.Descriptor{}, errdefs.InvalidArgument("importing image %q: its index.json is %d bytes", name, h.Size)
			}
			idx = &ocispec.Index{}
			if err := json.NewDecoder(tr).Decode(idx); err != nil {
				return ocispec.Descriptor{}, errdefs.InvalidArgument("importing image %q: its index.json: %v", name, err)
			}
		}
	}
	if !layout || idx == nil {
		return ocispec.Descriptor{}, errdefs.InvalidArgument("importing image %q: not an OCI image layout (oci-layout and index.json)", name)
	}
	var names []string
	for _, m := range idx.Manifests {
		n := m.Annotations[images.AnnotationImageName]
		if n == "" {
			n = m.Annotations[ocispec.AnnotationRefName]
		}
		names = append(names, n)
	}
	if len(idx.Manifests) != 1 || names[0] != name {
		return ocispec.Descriptor{}, errdefs.InvalidArgument("importing image %q: the archive must hold that image alone; it holds %q", name, names)
	}
	return idx.Manifests[0], nil
}
