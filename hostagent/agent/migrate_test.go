package agent_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// A host whose driver cannot move sandboxes live does not say it is
// pausable, and refuses the checkpoint calls (Unimplemented) before it
// reads any archive.
func TestLiveMoveRefusedWithoutMigrator(t *testing.T) {
	e := setup(t)
	e.start()
	if reg := e.ctl.Hosts()[hostID].Register; reg == nil || reg.Pausable {
		t.Fatalf("Register of a fake-driver host: %+v", reg)
	}
	if _, err := e.ensure("s1", nil); err != nil {
		t.Fatal(err)
	}
	c := e.sandboxClient()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := c.ExportCheckpoint(ctx, &pb.ExportCheckpointRequest{Key: "s1"})
	if err == nil {
		_, err = st.Recv()
	}
	if errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.UnimplementedKind {
		t.Errorf("ExportCheckpoint = %v, want kind unimplemented", err)
	}
	rs, err := c.RestoreCheckpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Send(&pb.RestoreCheckpointRequest{Key: "s1", Data: []byte("not a tar")}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if _, err := rs.CloseAndRecv(); errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.UnimplementedKind {
		t.Errorf("RestoreCheckpoint = %v, want kind unimplemented", err)
	}
}
