variable "hosts" {
  description = "The host agents: each a name (its host id, a DNS label), the address its machine listens on for the sandbox service and the control plane dials (an IPv4 address or a DNS name), and labels of its own."
  type = list(object({
    name    = string
    address = string
    labels  = optional(map(string), {})
  }))
  validation {
    condition     = length(var.hosts) > 0
    error_message = "hosts must list at least one host."
  }
  validation {
    condition     = alltrue([for h in var.hosts : can(regex("^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", h.name))])
    error_message = "each host name must be a DNS label: 1-63 lowercase letters, digits or dashes, not starting or ending with a dash."
  }
  validation {
    condition     = length(distinct([for h in var.hosts : h.name])) == length(var.hosts)
    error_message = "host names must be unique."
  }
  validation {
    condition     = alltrue([for h in var.hosts : can(regex("^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$", h.address))])
    error_message = "each host address must be an IPv4 address or a DNS name, without a port."
  }
}

variable "pool" {
  description = "The host pool every host joins (its pool label; the control plane's policy placement.yaml says which tenants may use it). Empty: no pool label."
  type        = string
  default     = ""
  validation {
    condition     = var.pool == "" || can(regex("^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", var.pool))
    error_message = "pool must be empty or a DNS label."
  }
}

variable "labels" {
  description = "Labels every host reports to the control plane (zone=a, ...); a host's own labels win over these, and pool over both."
  type        = map(string)
  default     = {}
  validation {
    condition = alltrue(flatten([for m in concat([var.labels], [for h in var.hosts : h.labels]) : [
      for k, v in m : can(regex("^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$", k)) && can(regex("^[A-Za-z0-9._-]{0,63}$", v))
    ]]))
    error_message = "label keys must be 1-63 letters, digits or ._/- and values up to 63 letters, digits or ._- (no commas, spaces or =)."
  }
}

variable "control_plane" {
  description = "Every control-plane node's host service address, host:port (the control-plane module's host_service_addresses)."
  type        = list(string)
  validation {
    condition     = length(var.control_plane) > 0 && alltrue([for a in var.control_plane : can(regex("^[A-Za-z0-9.-]+:[0-9]+$", a))])
    error_message = "control_plane must list host:port addresses."
  }
}

variable "join_tokens" {
  description = "Per host name, its one-time join token (`corral hosts token --server https://NODE:8090` mints one). A host without one renders an install script that refuses to run until the host has its certificate."
  type        = map(string)
  sensitive   = true
  default     = {}
  validation {
    condition     = alltrue([for t in values(var.join_tokens) : can(regex("^corral1\\.[A-Za-z0-9_-]+\\.[0-9a-f]{64}$", t))])
    error_message = "each join token must be one printed by `corral hosts token` (corral1.<secret>.<pin>)."
  }
}

variable "runtime" {
  description = "Sandbox runtime: gvisor (runsc under containerd), runc, or process (development only: it isolates nothing); or several, comma-separated, each offered by the same host agent, the first its default (e.g. \"gvisor,runc\")."
  type        = string
  default     = "gvisor"
  validation {
    condition     = alltrue([for r in split(",", var.runtime) : contains(["gvisor", "runc", "process"], r)]) && length(distinct(split(",", var.runtime))) == length(split(",", var.runtime))
    error_message = "runtime must be gvisor, runc or process, or several of them comma-separated, each once."
  }
}

variable "allow_untrusted_process_runtime" {
  description = "Acknowledge that runtime process isolates nothing; required with it."
  type        = bool
  default     = false
  validation {
    condition     = !contains(split(",", var.runtime), "process") || var.allow_untrusted_process_runtime
    error_message = "runtime process runs sandboxes' commands on the host itself: set allow_untrusted_process_runtime = true to acknowledge it (development only)."
  }
}

variable "manage_containerd" {
  description = "Render and start a private containerd for the hosts (corral-containerd.service, its config, the runsc shim on its PATH), listening on containerd_address. False: containerd_address is one already running."
  type        = bool
  default     = true
}

variable "containerd_binary" {
  description = "containerd v2 binary, with manage_containerd (containerd-shim-runc-v2 beside it)."
  type        = string
  default     = "/usr/local/bin/containerd"
}

variable "containerd_address" {
  description = "containerd socket the host agent uses."
  type        = string
  default     = "/var/lib/corral/containerd/containerd.sock"
  validation {
    condition     = can(regex("^/[A-Za-z0-9._/-]+$", var.containerd_address)) && length(var.containerd_address) < 100
    error_message = "containerd_address must be an absolute socket path under 100 bytes (a unix socket's limit, with .ttrpc beside it)."
  }
}

variable "runsc_path" {
  description = "runsc binary (gVisor), for runtime gvisor."
  type        = string
  default     = "/usr/local/bin/runsc"
}

variable "images" {
  description = "OCI image tarballs on each machine to import into containerd (namespace corral) before the host starts: the sandboxes' images and the canary's (localhost/corral/busybox:1 unless extra_args set --canary-image)."
  type        = list(string)
  default     = []
}

variable "state_dir" {
  description = "Each host's state directory (certificate, sandbox records, kept workspaces): beneath /var/lib, where systemd's StateDirectory= creates it."
  type        = string
  default     = "/var/lib/corral/host"
  validation {
    condition     = can(regex("^/var/lib/[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$", var.state_dir)) && !strcontains(var.state_dir, "..")
    error_message = "state_dir must be an absolute path beneath /var/lib (systemd's StateDirectory=), without .. or a trailing slash."
  }
}

variable "listen_port" {
  description = "Port of each host's sandbox service (mutual TLS), at its address."
  type        = number
  default     = 8443
  validation {
    condition     = var.listen_port >= 1 && var.listen_port <= 65535 && floor(var.listen_port) == var.listen_port
    error_message = "listen_port must be a port number."
  }
}

variable "binary_path" {
  description = "Where the corral binary is installed on each machine; on gVisor hosts, corral-spawn (make build's bin/corral-spawn) belongs beside it."
  type        = string
  default     = "/usr/local/bin/corral"
  validation {
    condition     = can(regex("^/[A-Za-z0-9._/+-]+$", var.binary_path))
    error_message = "binary_path must be an absolute path without spaces or quotes."
  }
}

variable "extra_args" {
  description = "More `corral host` flags for every host, one word each (--no-warm-pools, --pausable-sandboxes, ...)."
  type        = list(string)
  default     = []
  validation {
    condition     = alltrue([for a in var.extra_args : can(regex("^[A-Za-z0-9=:,./@_+-]+$", a))])
    error_message = "each extra argument must be one word of letters, digits and =:,./@_+- (no spaces or quotes: the unit does not quote)."
  }
}
