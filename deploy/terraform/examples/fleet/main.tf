# A corral fleet over an existing PostgreSQL: three control-plane nodes and
# a pool of gVisor hosts. It renders each machine's files, install script
# and cloud-init document; feed them to the resources that create your
# machines (user_data = module.control_plane.nodes["cp-1"].cloud_init), or
# copy install_script to each machine and run it as root.
#
# Bring-up takes three applies (see deploy/terraform/README.md): the first
# node, then the other nodes with their node join tokens, then the hosts
# with theirs; then cluster_formed = true.

terraform {
  required_version = ">= 1.9"
}

variable "control_plane_nodes" {
  description = "Control-plane machines: name and address (3 or 5)."
  type        = list(object({ name = string, address = string }))
  default = [
    { name = "cp-1", address = "10.0.0.11" },
    { name = "cp-2", address = "10.0.0.12" },
    { name = "cp-3", address = "10.0.0.13" },
  ]
}

variable "hosts" {
  description = "Host machines: name, address and labels of their own."
  type        = list(object({ name = string, address = string, labels = optional(map(string), {}) }))
  default = [
    { name = "host-1", address = "10.0.1.11", labels = { zone = "a" } },
    { name = "host-2", address = "10.0.1.12", labels = { zone = "b" } },
  ]
}

variable "app_database_url" {
  description = "PostgreSQL URL of the application role (corral_app)."
  type        = string
  sensitive   = true
}

variable "owner_database_url" {
  description = "PostgreSQL URL of the owner role: the nodes migrate at start."
  type        = string
  sensitive   = true
}

variable "seal_key_file" {
  description = "Local seal key file (`corral admin seal new-key --seal-key-file seal.key`); copied to every node."
  type        = string
  default     = "seal.key"
}

variable "tls_dir" {
  description = "Local directory with each node's certificate and key as NAME.crt and NAME.key (naming its address); a node without them must have them on its machine already."
  type        = string
  default     = "tls"
}

variable "node_join_tokens" {
  description = "Per joining node, a token from node_token_command on the first node."
  type        = map(string)
  sensitive   = true
  default     = {}
}

variable "host_join_tokens" {
  description = "Per host, a token from `corral hosts token`."
  type        = map(string)
  sensitive   = true
  default     = {}
}

variable "cluster_formed" {
  description = "true once every node has joined: the first node stops bootstrapping."
  type        = bool
  default     = false
}

variable "blob_dir" {
  description = "A directory every control-plane node mounts (NFS, ...): drained workspaces and files."
  type        = string
  default     = "/mnt/corral-blobs"
}

variable "binary_path" {
  description = "Where the corral binary is on every machine."
  type        = string
  default     = "/usr/local/bin/corral"
}

variable "host_runtime" {
  description = "Sandbox runtime of the hosts (and of the sessions' sandboxes): gvisor, runc or process."
  type        = string
  default     = "gvisor"
}

variable "manage_containerd" {
  description = "Render a private containerd on each host."
  type        = bool
  default     = true
}

variable "containerd_binary" {
  description = "containerd v2 on each host, with manage_containerd."
  type        = string
  default     = "/usr/local/bin/containerd"
}

variable "containerd_address" {
  description = "containerd socket on each host."
  type        = string
  default     = "/var/lib/corral/containerd/containerd.sock"
}

variable "runsc_path" {
  description = "runsc on each host."
  type        = string
  default     = "/usr/local/bin/runsc"
}

variable "images" {
  description = "OCI image tarballs on each host to import into containerd."
  type        = list(string)
  default     = ["/var/cache/corral/images/busybox.oci.tar", "/var/cache/corral/images/debian.oci.tar"]
}

variable "server_extra_args" {
  description = "More `corral server` flags."
  type        = list(string)
  default     = []
}

variable "host_extra_args" {
  description = "More `corral host` flags."
  type        = list(string)
  default     = []
}

locals {
  tls = { for n in var.control_plane_nodes : n.name => {
    cert_pem = file("${var.tls_dir}/${n.name}.crt")
    key_pem  = file("${var.tls_dir}/${n.name}.key")
  } if fileexists("${var.tls_dir}/${n.name}.crt") && fileexists("${var.tls_dir}/${n.name}.key") }
}

module "control_plane" {
  source = "../../modules/control-plane"

  nodes                  = var.control_plane_nodes
  database_url           = var.app_database_url
  migration_database_url = var.owner_database_url
  seal_key               = file(var.seal_key_file)
  tls_certificates       = local.tls
  node_join_tokens       = var.node_join_tokens
  cluster_formed         = var.cluster_formed
  blob_dir               = var.blob_dir
  binary_path            = var.binary_path
  sandbox_runtime        = var.host_runtime
  extra_args             = var.server_extra_args
}

module "host_pool" {
  source = "../../modules/host-pool"

  hosts                           = var.hosts
  pool                            = "general"
  control_plane                   = module.control_plane.host_service_addresses
  join_tokens                     = var.host_join_tokens
  runtime                         = var.host_runtime
  allow_untrusted_process_runtime = var.host_runtime == "process"
  manage_containerd               = var.manage_containerd
  containerd_binary               = var.containerd_binary
  containerd_address              = var.containerd_address
  runsc_path                      = var.runsc_path
  images                          = var.images
  binary_path                     = var.binary_path
  extra_args                      = var.host_extra_args
}

output "control_plane" {
  description = "Per node: files, unit, install_script, cloud_init (secret: database URLs)."
  sensitive   = true
  value       = module.control_plane.nodes
}

output "hosts" {
  description = "Per host: files, unit, install_script, cloud_init (secret: join tokens)."
  sensitive   = true
  value       = module.host_pool.hosts
}

output "node_token_command" {
  description = "Run as root on the first node to mint a joining node's token."
  value       = module.control_plane.node_token_command
}

output "first_node" {
  value = module.control_plane.first_node
}

output "api_urls" {
  value = module.control_plane.api_urls
}

output "grpc_addresses" {
  value = module.control_plane.grpc_addresses
}

output "host_service_addresses" {
  value = module.control_plane.host_service_addresses
}
