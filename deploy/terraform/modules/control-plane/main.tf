# Renders what each corral control-plane node needs on its machine: a
# systemd unit, its environment file, the shared seal key and the node's
# TLS material, as a list of files, an install script that writes them
# and starts the unit, and a cloud-init document that runs that script.
# It creates no resources and needs no provider, so it composes with
# whichever provider creates the machines (user_data, a configuration
# management file resource, or scp and sh).
#
# The first node bootstraps; the others join through it with a one-time
# node join token each, which exists only once the first node runs. So a
# cluster comes up in two applies: the first renders every node, of which
# only the first is ready; node_token_command mints the others' tokens
# there; the second apply, with node_join_tokens, makes them ready.

terraform {
  required_version = ">= 1.9"
}

locals {
  unit_name     = "corral-server.service"
  env_file      = "/etc/corral/server.env"
  seal_key_file = "/etc/corral/seal.key"
  first         = var.nodes[0]
  addr          = { for n in var.nodes : n.name => { for k, p in var.ports : k => "${n.address}:${p}" } }

  blob_args = var.blob_dir != "" ? ["--blob-dir", var.blob_dir] : concat(
    nonsensitive(var.blob_s3.insecure) ? ["--blob-s3-insecure"] : [],
    nonsensitive(var.blob_s3.path_style) ? [] : ["--blob-s3-path-style=false"],
  )
  blob_env = var.blob_s3 == null ? {} : {
    CORRAL_BLOB_S3_ENDPOINT   = var.blob_s3.endpoint
    CORRAL_BLOB_S3_BUCKET     = var.blob_s3.bucket
    CORRAL_BLOB_S3_ACCESS_KEY = var.blob_s3.access_key
    CORRAL_BLOB_S3_SECRET_KEY = var.blob_s3.secret_key
  }

  node = { for i, n in var.nodes : n.name => {
    bootstrap = i == 0 && !var.cluster_formed
    # A joining node's first start joins through the first node; once the
    # cluster is formed, the first node's unit joins through the second.
    # With Raft state in the data directory, --join is not used again.
    join_via = i == 0 ? local.addr[var.nodes[1].name].raft_http : local.addr[local.first.name].raft_http
    # Whether a token is given is not secret; the token stays so.
    has_token = contains(nonsensitive(keys(var.node_join_tokens)), n.name)
    has_tls   = contains(nonsensitive(keys(var.tls_certificates)), n.name)
  } }

  exec_args = { for i, n in var.nodes : n.name => concat([
    "server",
    "--node-id", n.name,
    "--data-dir", var.data_dir,
    "--http-addr", local.addr[n.name].http,
    "--grpc-addr", local.addr[n.name].grpc,
    "--raft-addr", local.addr[n.name].raft,
    "--raft-http-addr", local.addr[n.name].raft_http,
    "--host-addr", local.addr[n.name].host,
    "--tls-cert", var.tls_cert_file,
    "--tls-key", var.tls_key_file,
    "--seal-key-file", local.seal_key_file,
    "--sandbox-runtime", var.sandbox_runtime,
    "--log-format", "json",
    ], local.blob_args,
    local.node[n.name].bootstrap ? ["--bootstrap"] : ["--join", local.node[n.name].join_via],
    var.extra_args,
  ) }

  units = { for n in var.nodes : n.name => templatefile("${path.module}/templates/corral-server.service.tftpl", {
    node_id         = n.name
    env_file        = local.env_file
    binary_path     = var.binary_path
    args            = local.exec_args[n.name]
    state_directory = trimprefix(var.data_dir, "/var/lib/")
    blob_dir        = var.blob_dir
  }) }

  env_files = { for n in var.nodes : n.name => join("", [for k, v in merge(
    var.environment,
    local.blob_env,
    { CORRAL_DATABASE_URL = var.database_url },
    var.migration_database_url == "" ? {} : { CORRAL_MIGRATION_DATABASE_URL = var.migration_database_url },
    local.node[n.name].has_token ? { CORRAL_NODE_JOIN_TOKEN = var.node_join_tokens[n.name] } : {},
  ) : "${k}=${v}\n"]) }

  files = { for n in var.nodes : n.name => concat([
    { path = local.env_file, mode = "0640", owner = "root:corral", content = local.env_files[n.name] },
    { path = local.seal_key_file, mode = "0640", owner = "root:corral", content = var.seal_key },
    ], local.node[n.name].has_tls ? [
    { path = var.tls_cert_file, mode = "0644", owner = "root:corral", content = var.tls_certificates[n.name].cert_pem },
    { path = var.tls_key_file, mode = "0640", owner = "root:corral", content = var.tls_certificates[n.name].key_pem },
    ] : [], [
    { path = "/etc/systemd/system/${local.unit_name}", mode = "0644", owner = "root:root", content = local.units[n.name] },
  ]) }

  install_scripts = { for n in var.nodes : n.name => templatefile("${path.module}/templates/install.sh.tftpl", {
    node_id      = n.name
    binary_path  = var.binary_path
    unit_name    = local.unit_name
    files        = local.files[n.name]
    dirs         = distinct(concat(["/etc/corral"], [for f in local.files[n.name] : dirname(f.path) if startswith(f.path, "/etc/corral/")]))
    needs_token  = !local.node[n.name].bootstrap && !local.node[n.name].has_token
    data_dir     = var.data_dir
    tls_files    = local.node[n.name].has_tls ? [] : [var.tls_cert_file, var.tls_key_file]
    token_advice = "mint one on ${local.first.name} with: ${local.node_token_command} and apply again with node_join_tokens[\"${n.name}\"]"
  }) }

  node_token_command = join(" ", [
    var.binary_path, "admin", "node-token",
    "--data-dir", var.data_dir,
    "--raft-http-addr", local.addr[local.first.name].raft_http,
    "--seal-key-file", local.seal_key_file,
    "--ttl", "1h",
  ])
}

output "nodes" {
  description = "Per node name: bootstrap (its unit starts a new cluster), ready (false for a joining node without its join token before the cluster is formed), exec_args (the unit's ExecStart after the binary), unit and unit_name, env_file (secret: database URLs, join token), files (path, mode, owner, content: everything the machine needs), install_script (writes the files, starts the unit; run as root) and cloud_init (runs the install script at first boot)."
  sensitive   = true
  value = { for n in var.nodes : n.name => {
    address        = n.address
    bootstrap      = local.node[n.name].bootstrap
    ready          = local.node[n.name].bootstrap || local.node[n.name].has_token || var.cluster_formed
    exec_args      = local.exec_args[n.name]
    unit_name      = local.unit_name
    unit           = local.units[n.name]
    env_file       = local.env_files[n.name]
    files          = local.files[n.name]
    install_script = local.install_scripts[n.name]
    cloud_init     = templatefile("${path.module}/templates/cloud-init.yaml.tftpl", { script = local.install_scripts[n.name] })
  } }
}

output "node_token_command" {
  description = "Run as root on the first node, once it serves, to mint a joining node's one-time token (one per node; each lasts an hour)."
  value       = local.node_token_command
}

output "first_node" {
  description = "The node that bootstraps the cluster (and where node_token_command runs)."
  value       = local.first.name
}

output "api_urls" {
  description = "The REST API (Managed Agents) of every node, over TLS."
  value       = [for n in var.nodes : "https://${local.addr[n.name].http}"]
}

output "grpc_addresses" {
  description = "The admin gRPC API of every node, over TLS (corral CLI --server https://ADDR)."
  value       = [for n in var.nodes : local.addr[n.name].grpc]
}

output "host_service_addresses" {
  description = "The host service of every node: host agents' --control-plane (host-pool's control_plane)."
  value       = [for n in var.nodes : local.addr[n.name].host]
}
