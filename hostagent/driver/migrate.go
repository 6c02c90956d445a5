package driver

import (
	"context"
	"io"
)

// Migrator is a Driver that can move a paused sandbox's processes to
// another host: its checkpoint image leaves as a stream, and a sandbox
// another driver made with the same image and spec takes them over from
// that stream. The workspace is not in the image; it moves apart (the host
// agent's workspace export and import) and must be in the target's
// workspace before the restore, since the restored processes find their
// open files there.
//
// The host agent asks for it with a type assertion: it is not part of
// Driver, which every driver implements.
type Migrator interface {
	// CanMigrate is nil when this driver's sandboxes can move live, or
	// says why not (kind unimplemented): a runtime without checkpoints,
	// or sandboxes whose commands a restore would kill.
	CanMigrate() error
	// ExportCheckpoint writes the checkpoint image of the paused sandbox
	// behind ref to w as a tar archive of regular files, and returns the
	// bytes of the files. A sandbox that is not paused is kind failed
	// precondition.
	ExportCheckpoint(ctx context.Context, ref Ref, w io.Writer) (int64, error)
	// RestoreCheckpoint gives the sandbox behind ref (made by Create on
	// this driver with the checkpointed sandbox's image and spec) the
	// processes and memory of the checkpoint read from r, a tar archive as
	// ExportCheckpoint writes it: its own processes are stopped and it runs
	// restored from the image. The archive is hostile input, bounded by
	// max; an entry past a bound, a link, or a name that leaves the image
	// directory is refused (kind invalid argument, or resource exhausted
	// for a bound). On any failure the sandbox is left running a new init
	// over its workspace, as after Create.
	RestoreCheckpoint(ctx context.Context, ref Ref, r io.Reader, max CheckpointLimits) error
}

// CheckpointLimits bound a checkpoint archive read by RestoreCheckpoint.
// Zero fields take the driver's defaults.
type CheckpointLimits struct {
	// TotalBytes bounds the sum of the files' sizes.
	TotalBytes int64
	// FileBytes bounds one file's size.
	FileBytes int64
	// Files bounds the number of entries (files and directories).
	Files int
}
