package spawn

// initVersion is the version of init's arguments (Init, which takes no
// version of its own): bump it when they change.
const initVersion = "1"

// Interface names the versions of everything the host's driver and a
// corral-spawn binary must agree on: the arguments of init, of the relay,
// of the start step and of the command server, and the wire formats
// between relay and init and between the driver and the server.
// `corral-spawn version` prints it; the driver refuses a binary that says
// anything else (a corral-spawn of another corral build beside the host's
// binary), rather than have every command fail.
func Interface() string {
	return "corral-spawn init " + initVersion + ", relay " + relayVersion + ", start " + startVersion + ", serve " + serveVersion + ", wire " + string(requestMagic) + "/" + string(replyMagic) + "/" + string(serveMagic)
}
