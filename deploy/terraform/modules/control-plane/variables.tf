variable "nodes" {
  description = "The control-plane nodes, 3 or 5: each a name (its node id, a DNS label) and the address its machine listens on and the others reach it at (an IPv4 address or a DNS name). The first bootstraps the cluster; the others join it."
  type = list(object({
    name    = string
    address = string
  }))
  validation {
    condition     = length(var.nodes) == 3 || length(var.nodes) == 5
    error_message = "nodes must list 3 or 5 nodes: Raft needs an odd number to keep a majority when one fails."
  }
  validation {
    condition     = alltrue([for n in var.nodes : can(regex("^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", n.name))])
    error_message = "each node name must be a DNS label: 1-63 lowercase letters, digits or dashes, not starting or ending with a dash."
  }
  validation {
    condition     = length(distinct([for n in var.nodes : n.name])) == length(var.nodes) && length(distinct([for n in var.nodes : n.address])) == length(var.nodes)
    error_message = "node names and addresses must be unique."
  }
  validation {
    condition     = alltrue([for n in var.nodes : can(regex("^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$", n.address))])
    error_message = "each node address must be an IPv4 address or a DNS name, without a port."
  }
}

variable "ports" {
  description = "Ports every node listens on, at its address: http (REST API), grpc (admin API), raft and raft_http (between nodes, mutual TLS), host (the host service host agents join, mutual TLS)."
  type = object({
    http      = optional(number, 8080)
    grpc      = optional(number, 8090)
    raft      = optional(number, 8300)
    raft_http = optional(number, 8301)
    host      = optional(number, 8443)
  })
  default = {}
  validation {
    condition     = length(distinct(values(var.ports))) == 5 && alltrue([for p in values(var.ports) : p >= 1024 && p <= 65535 && floor(p) == p])
    error_message = "ports must be five different integers from 1024 to 65535 (the unit runs without the capability to bind lower ones)."
  }
}

variable "database_url" {
  description = "PostgreSQL URL of the application role (corral_app) on the existing PostgreSQL."
  type        = string
  sensitive   = true
  validation {
    condition     = can(regex("^postgres(ql)?://[^\\s'\"\\\\]+$", var.database_url))
    error_message = "database_url must be a postgres:// URL without spaces, quotes or backslashes (percent-encode them): it goes in a systemd environment file."
  }
}

variable "migration_database_url" {
  description = "PostgreSQL URL of the owner role; when set, each node migrates at start (an advisory lock makes them take turns). Empty: migrate with `corral migrate` yourself."
  type        = string
  sensitive   = true
  default     = ""
  validation {
    condition     = var.migration_database_url == "" || can(regex("^postgres(ql)?://[^\\s'\"\\\\]+$", var.migration_database_url))
    error_message = "migration_database_url must be empty or a postgres:// URL without spaces, quotes or backslashes (percent-encode them)."
  }
}

variable "seal_key" {
  description = "Contents of the seal key file every node shares (`corral admin seal new-key --seal-key-file seal.key` makes one); written to /etc/corral/seal.key."
  type        = string
  sensitive   = true
  validation {
    condition     = length([for l in split("\n", var.seal_key) : l if can(regex("^[0-9a-f]{64}$", trimspace(l)))]) > 0 && alltrue([for l in split("\n", var.seal_key) : trimspace(l) == "" || startswith(trimspace(l), "#") || can(regex("^[0-9a-f]{64}$", trimspace(l)))])
    error_message = "seal_key must be a seal key file: one or more lines of 64 lowercase hex digits (lines starting with # are comments)."
  }
}

variable "tls_certificates" {
  description = "Per node name, the PEM certificate (chain) and key its REST and gRPC listeners serve, written to tls_cert_file and tls_key_file. A node not listed must have those files on its machine already. The certificate must name the node's address."
  type = map(object({
    cert_pem = string
    key_pem  = string
  }))
  sensitive = true
  default   = {}
  validation {
    condition     = alltrue([for c in values(var.tls_certificates) : strcontains(c.cert_pem, "-----BEGIN CERTIFICATE-----") && strcontains(c.key_pem, "PRIVATE KEY-----")])
    error_message = "each tls_certificates entry needs a PEM certificate and a PEM private key."
  }
}

variable "tls_cert_file" {
  description = "Where the node's TLS certificate is on its machine (replace the file to rotate: the node reloads it)."
  type        = string
  default     = "/etc/corral/tls/server.crt"
}

variable "tls_key_file" {
  description = "Where the node's TLS private key is on its machine."
  type        = string
  default     = "/etc/corral/tls/server.key"
}

variable "node_join_tokens" {
  description = "Per joining node name, its one-time node join token: `node_token_command` (an output) mints one on the first node once it runs. A joining node without one renders an install script that refuses to run and says so."
  type        = map(string)
  sensitive   = true
  default     = {}
  validation {
    condition     = alltrue([for t in values(var.node_join_tokens) : can(regex("^corralnode1\\.[A-Za-z0-9_-]+\\.[0-9a-f]{64}$", t))])
    error_message = "each node join token must be one printed by `corral admin node-token` (corralnode1.<secret>.<pin>)."
  }
}

variable "cluster_formed" {
  description = "Set once every node has joined: the first node's unit then joins the others instead of bootstrapping, so a first node whose data directory was lost cannot start a second cluster on the same PostgreSQL (it fails, wanting a join token, until you give it one)."
  type        = bool
  default     = false
}

variable "data_dir" {
  description = "Each node's data directory (Raft log, snapshots, node certificate): beneath /var/lib, where systemd's StateDirectory= creates it for the service's user and keeps it writable under ProtectSystem=strict."
  type        = string
  default     = "/var/lib/corral/server"
  validation {
    condition     = can(regex("^/var/lib/[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$", var.data_dir)) && !strcontains(var.data_dir, "..")
    error_message = "data_dir must be an absolute path beneath /var/lib (systemd's StateDirectory=), without .. or a trailing slash."
  }
}

variable "blob_dir" {
  description = "A directory every node shares (an NFS or similar mount on each machine) keeping drained workspaces and the Files API's content. Set this or blob_s3."
  type        = string
  default     = ""
  validation {
    condition     = var.blob_dir == "" || can(regex("^/[A-Za-z0-9._/-]+$", var.blob_dir))
    error_message = "blob_dir must be an absolute path."
  }
  validation {
    # Each node's own directory would lose a workspace drained through one
    # node and read through another.
    condition     = (var.blob_dir == "") != (var.blob_s3 == null)
    error_message = "set exactly one of blob_dir (a directory every node mounts) and blob_s3 (an S3 API): the nodes share drained workspaces and files."
  }
}

variable "blob_s3" {
  description = "An S3 API keeping drained workspaces and the Files API's content, instead of blob_dir."
  type = object({
    endpoint   = string
    bucket     = string
    access_key = string
    secret_key = string
    insecure   = optional(bool, false)
    path_style = optional(bool, true)
  })
  sensitive = true
  default   = null
  validation {
    # try: with no blob_s3 its attributes do not exist.
    condition     = try(alltrue([for v in [var.blob_s3.endpoint, var.blob_s3.bucket, var.blob_s3.access_key, var.blob_s3.secret_key] : can(regex("^[^\\s'\"\\\\]+$", v))]), var.blob_s3 == null)
    error_message = "blob_s3's endpoint, bucket and keys must be set, without spaces, quotes or backslashes."
  }
}

variable "binary_path" {
  description = "Where the corral binary is installed on each machine (the install script checks it is there)."
  type        = string
  default     = "/usr/local/bin/corral"
  validation {
    condition     = can(regex("^/[A-Za-z0-9._/+-]+$", var.binary_path))
    error_message = "binary_path must be an absolute path without spaces or quotes."
  }
}

variable "sandbox_runtime" {
  description = "Runtime sessions' sandboxes ask hosts for: gvisor, runc, or process (development only)."
  type        = string
  default     = "gvisor"
  validation {
    condition     = contains(["gvisor", "runc", "process"], var.sandbox_runtime)
    error_message = "sandbox_runtime must be gvisor, runc or process."
  }
}

variable "environment" {
  description = "More environment variables for every node (CORRAL_ANTHROPIC_API_KEY with --model anthropic, say), written to its environment file."
  type        = map(string)
  sensitive   = true
  default     = {}
  validation {
    condition     = alltrue([for k, v in var.environment : can(regex("^[A-Z_][A-Z0-9_]*$", k)) && can(regex("^[^\\s'\"\\\\]*$", v))])
    error_message = "environment names must be upper-case shell names, and values without spaces, quotes or backslashes (a systemd environment file takes them as written)."
  }
}

variable "extra_args" {
  description = "More `corral server` flags for every node, one word each (--model anthropic, --policy-dir /etc/corral/policy, ...)."
  type        = list(string)
  default     = []
  validation {
    condition     = alltrue([for a in var.extra_args : can(regex("^[A-Za-z0-9=:,./@_+-]+$", a))])
    error_message = "each extra argument must be one word of letters, digits and =:,./@_+- (no spaces or quotes: the unit does not quote)."
  }
}
