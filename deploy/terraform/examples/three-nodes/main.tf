# Three control-plane nodes sharing one PostgreSQL. Feed each unit to the
# machines you create (cloud-init, configuration management).

variable "app_database_url" {
  type      = string
  sensitive = true
}

variable "owner_database_url" {
  type      = string
  sensitive = true
}

module "node" {
  source   = "../../modules/corral-node"
  for_each = toset(["cp-1", "cp-2", "cp-3"])

  node_id      = each.key
  database_url = var.app_database_url
  # Every node may migrate at start: an advisory lock makes them take turns.
  migration_database_url = var.owner_database_url
}

output "units" {
  value = { for k, m in module.node : k => m.systemd_unit }
}
