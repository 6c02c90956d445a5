package agent_test

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/durationpb"

	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// TestValidateBuild: a build request outside its bounds is refused
// before anything runs.
func TestValidateBuild(t *testing.T) {
	ok := func() *pb.BuildImageRequest {
		return &pb.BuildImageRequest{
			Ref: "corral.build/" + strings.Repeat("ab", 32), BaseImage: "localhost/corral/debian:bookworm-2",
			AllowedHosts: []string{"localhost"},
			Steps: []*pb.BuildStep{{Name: "apt", Command: []string{"true"},
				Files: map[string][]byte{"/etc/apt/sources.list.d/corral-mirror.list": []byte("deb x ./\n")}}},
		}
	}
	steps := func(n int) []*pb.BuildStep {
		var s []*pb.BuildStep
		for range n {
			s = append(s, &pb.BuildStep{Name: "s", Command: []string{"true"}})
		}
		return s
	}
	for _, tc := range []struct {
		name string
		edit func(*pb.BuildImageRequest)
		ok   bool
	}{
		{"valid", func(*pb.BuildImageRequest) {}, true},
		{"sixteen steps", func(r *pb.BuildImageRequest) { r.Steps = steps(16) }, true},
		{"a tagged ref", func(r *pb.BuildImageRequest) { r.Ref = "corral.build/env:v2" }, true},
		{"no ref", func(r *pb.BuildImageRequest) { r.Ref = "" }, false},
		{"a ref with a space", func(r *pb.BuildImageRequest) { r.Ref = "corral.build/a b" }, false},
		{"a ref with a newline", func(r *pb.BuildImageRequest) { r.Ref = "corral.build/a\n" }, false},
		{"a ref of 256 bytes", func(r *pb.BuildImageRequest) { r.Ref = "corral.build/" + strings.Repeat("a", 256-13) }, false},
		{"a ref without a host", func(r *pb.BuildImageRequest) { r.Ref = "/abc" }, false},
		{"a ref with a scheme", func(r *pb.BuildImageRequest) { r.Ref = "http://corral.build/a" }, false},
		{"a ref with a query", func(r *pb.BuildImageRequest) { r.Ref = "corral.build/a?x=1" }, false},
		{"no base image", func(r *pb.BuildImageRequest) { r.BaseImage = "" }, false},
		{"no steps", func(r *pb.BuildImageRequest) { r.Steps = nil }, false},
		{"too many steps", func(r *pb.BuildImageRequest) { r.Steps = steps(17) }, false},
		{"an empty command", func(r *pb.BuildImageRequest) { r.Steps[0].Command = nil }, false},
		{"an unnamed step", func(r *pb.BuildImageRequest) { r.Steps[0].Name = "" }, false},
		{"a relative file path", func(r *pb.BuildImageRequest) { r.Steps[0].Files = map[string][]byte{"etc/x": nil} }, false},
		{"a file path with ..", func(r *pb.BuildImageRequest) { r.Steps[0].Files = map[string][]byte{"/etc/../x": nil} }, false},
		{"an unclean file path", func(r *pb.BuildImageRequest) { r.Steps[0].Files = map[string][]byte{"/etc//x": nil} }, false},
		{"the root as a file", func(r *pb.BuildImageRequest) { r.Steps[0].Files = map[string][]byte{"/": nil} }, false},
		{"a file of 64 KiB", func(r *pb.BuildImageRequest) { r.Steps[0].Files = map[string][]byte{"/x": make([]byte, 64<<10)} }, true},
		{"an oversize file", func(r *pb.BuildImageRequest) { r.Steps[0].Files = map[string][]byte{"/x": make([]byte, 64<<10+1)} }, false},
		{"too many files", func(r *pb.BuildImageRequest) {
			r.Steps[0].Files = map[string][]byte{}
			for i := range 17 {
				r.Steps[0].Files["/f"+strings.Repeat("x", i)] = nil
			}
		}, false},
		{"a bad env name", func(r *pb.BuildImageRequest) { r.Steps[0].Env = map[string]string{"A=B": "c"} }, false},
		{"any host", func(r *pb.BuildImageRequest) { r.AllowedHosts = []string{"*"} }, false},
		{"negative limits", func(r *pb.BuildImageRequest) { r.Limits = &pb.Limits{MemoryBytes: -1} }, false},
		{"a negative timeout", func(r *pb.BuildImageRequest) { r.Timeout = durationpb.New(-1) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ok()
			tc.edit(r)
			err := agent.ValidateBuild(r)
			if tc.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tc.ok && !errdefs.IsInvalidArgument(err) {
				t.Fatalf("want invalid argument, got %v", err)
			}
		})
	}
}

// TestBuildImageUnimplemented: a host whose driver cannot build (here the
// fake; runc and the process driver likewise) answers Unimplemented.
func TestBuildImageUnimplemented(t *testing.T) {
	e := setup(t)
	e.start()
	c := e.sandboxClient()
	req := &pb.BuildImageRequest{Ref: "corral.build/x", BaseImage: "img", Steps: []*pb.BuildStep{{Name: "s", Command: []string{"true"}}}}
	st, err := c.BuildImage(t.Context(), req)
	if err == nil {
		_, err = st.Recv()
	}
	if errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.UnimplementedKind {
		t.Errorf("BuildImage on the fake driver: %v", err)
	}
	ex, err := c.ExportImage(t.Context(), &pb.ExportImageRequest{Image: "corral.build/x"})
	if err == nil {
		_, err = ex.Recv()
	}
	if errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.UnimplementedKind {
		t.Errorf("ExportImage on the fake driver: %v", err)
	}
}
