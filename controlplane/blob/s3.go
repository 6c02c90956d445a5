package blob

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
)

// S3Config configures an S3-compatible Store.
type S3Config struct {
	// Endpoint is host:port of the S3 API. Required.
	Endpoint string
	// Bucket must exist. Required.
	Bucket string
	// Prefix is put before every key ("corral/drain/", say).
	Prefix    string
	AccessKey string
	SecretKey logging.Secret
	// Region; empty lets the client ask the server.
	Region string
	// Insecure speaks plain HTTP (a MinIO on a private network).
	Insecure bool
	// PathStyle addresses the bucket in the path rather than the host name
	// (most S3-compatible servers other than AWS want it).
	PathStyle bool
	// Transport, if set, carries the requests (a private CA, say).
	Transport http.RoundTripper
}

// s3PartSize is the part size of uploads of unknown length.
const s3PartSize = 16 << 20

// S3 is a Store in an S3-compatible bucket.
type S3 struct {
	cfg    S3Config
	client *minio.Client
}

var _ Store = (*S3)(nil)

// NewS3 returns a Store over the bucket. It does not contact the server.
func NewS3(cfg S3Config) (*S3, error) {
	if cfg.Endpoint == "" || cfg.Bucket == "" {
		return nil, errdefs.InvalidArgument("an S3 blob store needs an endpoint and a bucket")
	}
	if cfg.Prefix != "" && !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	lookup := minio.BucketLookupAuto
	if cfg.PathStyle {
		lookup = minio.BucketLookupPath
	}
	c, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:        credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey.Reveal(), ""),
		Secure:       !cfg.Insecure,
		Region:       cfg.Region,
		BucketLookup: lookup,
		Transport:    cfg.Transport,
	})
	if err != nil {
		return nil, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "S3 endpoint %s", cfg.Endpoint)
	}
	return &S3{cfg: cfg, client: c}, nil
}

func (s *S3) name(key string) (string, error) {
	if err := ValidKey(key); err != nil {
		return "", err
	}
	return s.cfg.Prefix + key, nil
}

// Put uploads the object; S3 makes it visible only once complete.
func (s *S3) Put(ctx context.Context, key string, r io.Reader) error {
	name, err := s.name(key)
	if err != nil {
		return err
	}
	_, err = s.client.PutObject(ctx, s.cfg.Bucket, name, r, -1, minio.PutObjectOptions{
		ContentType: "application/x-tar", PartSize: s3PartSize,
	})
	if err != nil {
		return fmt.Errorf("storing blob %s in bucket %s: %w", key, s.cfg.Bucket, err)
	}
	return nil
}

// Get opens the object.
func (s *S3) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	name, err := s.name(key)
	if err != nil {
		return nil, err
	}
	obj, err := s.client.GetObject(ctx, s.cfg.Bucket, name, minio.GetObjectOptions{})
	if err == nil {
		_, err = obj.Stat() // GetObject is lazy: ask now whether it exists
	}
	if err != nil {
		if obj != nil {
			obj.Close()
		}
		if minio.ToErrorResponse(err).Code == minio.NoSuchKey {
			return nil, errdefs.NotFound("blob %s", key)
		}
		return nil, fmt.Errorf("reading blob %s from bucket %s: %w", key, s.cfg.Bucket, err)
	}
	return obj, nil
}

// Delete removes the object; S3 does not mind a missing one.
func (s *S3) Delete(ctx context.Context, key string) error {
	name, err := s.name(key)
	if err != nil {
		return err
	}
	if err := s.client.RemoveObject(ctx, s.cfg.Bucket, name, minio.RemoveObjectOptions{}); err != nil {
		return fmt.Errorf("removing blob %s from bucket %s: %w", key, s.cfg.Bucket, err)
	}
	return nil
}

// List lists the objects under prefix/, one listing page at a time.
func (s *S3) List(ctx context.Context, prefix string, fn func(Object) error) error {
	name, err := s.name(prefix)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the lister when fn stops early
	for o := range s.client.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{Prefix: name + "/", Recursive: true}) {
		if o.Err != nil {
			return fmt.Errorf("listing blobs %s in bucket %s: %w", prefix, s.cfg.Bucket, o.Err)
		}
		key, ok := strings.CutPrefix(o.Key, s.cfg.Prefix)
		if !ok || ValidKey(key) != nil {
			continue // not one of ours
		}
		if err := fn(Object{Key: key, Size: o.Size, Modified: o.LastModified}); err != nil {
			return err
		}
	}
	return nil
}

// DeletePrefix removes every object under prefix/, one listing page at a
// time.
func (s *S3) DeletePrefix(ctx context.Context, prefix string) error {
	name, err := s.name(prefix)
	if err != nil {
		return err
	}
	objects := s.client.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{Prefix: name + "/", Recursive: true})
	var first error
	for e := range s.client.RemoveObjects(ctx, s.cfg.Bucket, objects, minio.RemoveObjectsOptions{}) {
		if first == nil { // read on to the end: the remover waits for its reader
			first = fmt.Errorf("removing blob %s from bucket %s: %w", e.ObjectName, s.cfg.Bucket, e.Err)
		}
	}
	return first
}
