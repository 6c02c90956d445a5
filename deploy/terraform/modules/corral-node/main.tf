# Renders what one corral control-plane node needs on its machine: a systemd
# unit and its environment file. It creates no resources of its own, so it
# composes with whichever provider creates the machines (cloud-init
# user_data, a configuration-management file resource, ...).

terraform {
  required_version = ">= 1.5"
}

variable "node_id" {
  description = "The node's id in the cluster."
  type        = string
  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,62}$", var.node_id))
    error_message = "node_id must be 1-63 lowercase letters, digits or dashes, starting with a letter or digit."
  }
}

variable "database_url" {
  description = "PostgreSQL URL of the application role (corral_app)."
  type        = string
  sensitive   = true
}

variable "migration_database_url" {
  description = "PostgreSQL URL of the owner role; when set, the node migrates at start."
  type        = string
  sensitive   = true
  default     = ""
}

variable "http_addr" {
  description = "HTTP listen address."
  type        = string
  default     = "0.0.0.0:8080"
}

variable "grpc_addr" {
  description = "gRPC listen address."
  type        = string
  default     = "0.0.0.0:8090"
}

variable "binary_path" {
  description = "Where the corral binary is installed on the machine."
  type        = string
  default     = "/usr/local/bin/corral"
}

locals {
  env_file = "/etc/corral/${var.node_id}.env"
}

output "systemd_unit" {
  description = "Contents of /etc/systemd/system/corral-server.service."
  value = templatefile("${path.module}/corral-server.service.tftpl", {
    binary_path = var.binary_path
    env_file    = local.env_file
    node_id     = var.node_id
    http_addr   = var.http_addr
    grpc_addr   = var.grpc_addr
  })
}

output "env_file_path" {
  description = "Where the environment file goes; write it with mode 0600."
  value       = local.env_file
}

output "env_file" {
  description = "Contents of the environment file (database URLs: secret)."
  sensitive   = true
  value = join("\n", compact([
    "CORRAL_DATABASE_URL=${var.database_url}",
    var.migration_database_url == "" ? "" : "CORRAL_MIGRATION_DATABASE_URL=${var.migration_database_url}",
    "",
  ]))
}
