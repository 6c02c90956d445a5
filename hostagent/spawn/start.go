package spawn

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// NotFound starts the message of a command that is not on the PATH (the
// driver's relayNotFound): exit 127, that line alone on stderr.
const NotFound = "corral: command not found: "

// startVersion is the version of start's arguments.
const startVersion = "1"

// startArgs is the argv of the start step of req, at most nproc processes:
// after the mode, its version, nproc, the path, the directory, argc, argv
// and the environment.
func startArgs(nproc uint64, req Request) []string {
	args := make([]string, 0, 7+len(req.Argv)+len(req.Env))
	args = append(args, "corral-spawn", "start", startVersion, strconv.FormatUint(nproc, 10), req.Path, req.Dir, strconv.Itoa(len(req.Argv)))
	args = append(args, req.Argv...)
	return append(args, req.Env...)
}

// parseStart reads startArgs' arguments after the mode.
func parseStart(args []string) (uint64, Request, error) {
	if len(args) < 5 || args[0] != startVersion {
		return 0, Request{}, errors.New("start: want version " + startVersion + ", nproc, path, dir, argc, argv and env")
	}
	nproc, err := strconv.ParseUint(args[1], 10, 64)
	if err != nil || nproc == 0 {
		return 0, Request{}, fmt.Errorf("start: nproc %q", args[1])
	}
	argc, err := strconv.Atoi(args[4])
	rest := args[5:]
	if err != nil || argc < 1 || argc > len(rest) {
		return 0, Request{}, fmt.Errorf("start: argc %q of %d arguments", args[4], len(rest))
	}
	req := Request{Path: args[2], Dir: args[3], Argv: rest[:argc], Env: rest[argc:]}
	return nproc, req, req.check()
}

// Start is the start step: in the session init gave it, with the
// command's streams as its own, it lowers RLIMIT_NPROC to the sandbox's
// limit, changes to the command's directory and execve's it. It returns
// only on failure, with the exit status a shell would give, having said
// why on stderr: 2 for a directory it cannot enter (as cd), 127 for a
// command not found, 126 for one that cannot be run.
//
// Between the rlimit and the execve it makes raw system calls only: the Go
// runtime must need no new thread once the limit is down (under a fork bomb
// none could be made).
func Start(args []string) int {
	nproc, req, err := parseStart(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "corral:", err)
		return 126
	}
	dir, err := syscall.BytePtrFromString(req.Dir)
	if err != nil {
		return 126
	}
	lim := unix.Rlimit{Cur: nproc, Max: nproc}
	if _, _, e := syscall.RawSyscall6(unix.SYS_PRLIMIT64, 0, unix.RLIMIT_NPROC, uintptr(unsafe.Pointer(&lim)), 0, 0, 0); e != 0 {
		fmt.Fprintf(os.Stderr, "corral: lowering RLIMIT_NPROC to %d: %v\n", nproc, e)
		return 126
	}
	if _, _, e := syscall.RawSyscall(unix.SYS_CHDIR, uintptr(unsafe.Pointer(dir)), 0, 0); e != 0 {
		fmt.Fprintf(os.Stderr, "corral: cd %s: %v\n", req.Dir, e)
		return 2
	}
	// Only the three streams reach the command, whatever init held
	// without close-on-exec (an older kernel without close_range leaves
	// that to the close-on-exec flags Go sets).
	_, _, _ = syscall.RawSyscall(unix.SYS_CLOSE_RANGE, 3, ^uintptr(0)>>32, unix.CLOSE_RANGE_CLOEXEC)
	err = syscall.Exec(req.Path, req.Argv, req.Env)
	if errors.Is(err, syscall.ENOEXEC) {
		// What a shell does with an executable that is no binary and
		// has no #! line: runs it as a script.
		err = syscall.Exec("/bin/sh", append([]string{"sh", req.Path}, req.Argv[1:]...), req.Env)
	}
	if errors.Is(err, syscall.ENOENT) {
		fmt.Fprintf(os.Stderr, "%s%s\n", NotFound, req.Argv[0])
		return 127
	}
	fmt.Fprintf(os.Stderr, "corral: %s: %v\n", req.Argv[0], err)
	return 126
}
