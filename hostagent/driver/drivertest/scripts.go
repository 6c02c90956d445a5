package drivertest

// The commands the suite runs, as sh -c scripts. They use only busybox sh
// features. Fake implements each one natively.
const (
	// ScriptStream says ready, waits for one line on stdin, then answers on
	// both streams.
	ScriptStream = `echo ready; read x; echo "got $x"; echo "err $x" >&2`
	// ScriptSleep says started and sleeps ten minutes.
	ScriptSleep = `echo started; sleep 600`
	// ScriptFlood prints 2000 numbered lines.
	ScriptFlood = `i=0; while [ $i -lt 2000 ]; do echo "line $i"; i=$((i+1)); done`
	// ScriptBackground leaves a sleeping process behind and writes its pid
	// to bg.pid.
	ScriptBackground = `sleep 600 </dev/null >/dev/null 2>&1 & echo $! > bg.pid`
	// ScriptAlive exits 0 if the process in bg.pid still runs.
	ScriptAlive = `kill -0 "$(cat bg.pid)"`
	// ScriptExit3 exits with code 3.
	ScriptExit3 = `echo bye; exit 3`
	// ScriptEnv prints two variables the suite sets and one it sets only
	// in the host's environment, which must not reach the sandbox.
	ScriptEnv = `echo "$SPEC_VAR $REQ_VAR [$CORRAL_HOST_SECRET]"`
	// ScriptPwd prints the working directory.
	ScriptPwd = `pwd`
	// ScriptWrite writes made-by-exec.txt.
	ScriptWrite = `echo from-exec > made-by-exec.txt`
	// ScriptCat prints note.txt.
	ScriptCat = `cat note.txt`
	// ScriptCatStdin copies stdin to stdout until end of file.
	ScriptCatStdin = `cat`
	// ScriptSymlinks creates links leading out of the workspace.
	ScriptSymlinks = `ln -s /etc escape && ln -s .. up && ln -s /etc/hostname host-file`
)

// SecretEnv is set in the test process's environment; its value must never
// appear in a sandbox.
const SecretEnv = "CORRAL_HOST_SECRET"

func sh(script string) []string { return []string{"sh", "-c", script} }
