# Renders what each corral host agent needs on its machine: a systemd unit
# for `corral host` with its labels, pool and control-plane addresses, an
# environment file with its one-time join token, and (with
# manage_containerd) a private containerd with runsc on its PATH, as a
# list of files, an install script that writes them and starts the units,
# and a cloud-init document that runs that script. Like the control-plane
# module it creates no resources and needs no provider.
#
# A host's join token is minted by the running control plane
# (`corral hosts token`), so hosts are ready from the apply after the
# cluster serves. Once a host has its certificate (in state_dir) it needs
# no token again.

terraform {
  required_version = ">= 1.9"
}

locals {
  unit_name            = "corral-host.service"
  containerd_unit_name = "corral-containerd.service"
  env_file             = "/etc/corral/host.env"
  containerd_config    = "/etc/corral/containerd.toml"
  containerd_dir       = dirname(var.containerd_address)

  runtimes = split(",", var.runtime)
  # Whether containerd runs any of the hosts' runtimes (all but process).
  containerd = length(setsubtract(local.runtimes, ["process"])) > 0

  labels = { for h in var.hosts : h.name => merge(var.labels, h.labels, var.pool == "" ? {} : { pool = var.pool }) }
  # Whether a token is given is not secret; the token stays so.
  has_token = { for h in var.hosts : h.name => contains(nonsensitive(keys(var.join_tokens)), h.name) }

  exec_args = { for h in var.hosts : h.name => concat([
    "host",
    "--host-id", h.name,
    "--state-dir", var.state_dir,
    "--listen", "${h.address}:${var.listen_port}",
    "--control-plane", join(",", var.control_plane),
    "--runtime", var.runtime,
    "--log-format", "json",
    ],
    contains(local.runtimes, "process") ? ["--allow-untrusted-process-runtime"] : [],
    local.containerd ? ["--containerd-address", var.containerd_address] : [],
    contains(local.runtimes, "gvisor") ? ["--runsc", var.runsc_path] : [],
    flatten([for k in sort(keys(local.labels[h.name])) : ["--label", "${k}=${local.labels[h.name][k]}"]]),
    var.extra_args,
  ) }

  units = { for h in var.hosts : h.name => templatefile("${path.module}/templates/corral-host.service.tftpl", {
    host_id         = h.name
    env_file        = local.env_file
    binary_path     = var.binary_path
    args            = local.exec_args[h.name]
    state_directory = trimprefix(var.state_dir, "/var/lib/")
    containerd_unit = var.manage_containerd && local.containerd ? local.containerd_unit_name : ""
  }) }

  containerd_unit = templatefile("${path.module}/templates/corral-containerd.service.tftpl", {
    containerd_binary = var.containerd_binary
    config            = local.containerd_config
    # containerd finds the runc shim, and the shim runc (or runsc), on its
    # PATH: their directories come first.
    path = join(":", distinct(concat([dirname(var.containerd_binary), dirname(var.runsc_path)], ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"])))
  })
  containerd_toml = templatefile("${path.module}/templates/containerd.toml.tftpl", {
    dir    = local.containerd_dir
    socket = var.containerd_address
  })

  files = { for h in var.hosts : h.name => concat([
    { path = local.env_file, mode = "0600", owner = "root:root", content = local.has_token[h.name] ? "CORRAL_JOIN_TOKEN=${var.join_tokens[h.name]}\n" : "" },
    ], var.manage_containerd && local.containerd ? [
    { path = local.containerd_config, mode = "0644", owner = "root:root", content = local.containerd_toml },
    { path = "/etc/systemd/system/${local.containerd_unit_name}", mode = "0644", owner = "root:root", content = local.containerd_unit },
    ] : [], [
    { path = "/etc/systemd/system/${local.unit_name}", mode = "0644", owner = "root:root", content = local.units[h.name] },
  ]) }

  install_scripts = { for h in var.hosts : h.name => templatefile("${path.module}/templates/install.sh.tftpl", {
    host_id           = h.name
    binary_path       = var.binary_path
    unit_name         = local.unit_name
    containerd_unit   = var.manage_containerd && local.containerd ? local.containerd_unit_name : ""
    containerd_binary = var.containerd_binary
    containerd_dir    = local.containerd_dir
    runtime_binaries  = contains(local.runtimes, "gvisor") ? [var.runsc_path] : []
    # corral host looks for the compiled spawner beside its own binary:
    # every gVisor sandbox's command server, and a pausable one's init.
    spawn_binary = contains(local.runtimes, "gvisor") ? "${dirname(var.binary_path)}/corral-spawn" : ""
    ctr          = "${dirname(var.containerd_binary)}/ctr"
    address      = var.containerd_address
    images       = local.containerd ? var.images : []
    files        = local.files[h.name]
    needs_token  = !local.has_token[h.name]
    state_dir    = var.state_dir
  }) }
}

output "hosts" {
  description = "Per host name: ready (its first start has a join token; a host that has its certificate needs none and runs its install script again without), labels, exec_args (the unit's ExecStart after the binary), unit and unit_name, files (path, mode, owner, content: everything the machine needs; the environment file holds the join token), install_script (writes the files, starts the units; run as root) and cloud_init (runs the install script at first boot)."
  sensitive   = true
  value = { for h in var.hosts : h.name => {
    address        = h.address
    ready          = local.has_token[h.name]
    labels         = local.labels[h.name]
    exec_args      = local.exec_args[h.name]
    unit_name      = local.unit_name
    unit           = local.units[h.name]
    files          = local.files[h.name]
    install_script = local.install_scripts[h.name]
    cloud_init     = templatefile("${path.module}/templates/cloud-init.yaml.tftpl", { script = local.install_scripts[h.name] })
  } }
}

output "sandbox_service_addresses" {
  description = "Every host's sandbox service, host:port (the control plane dials these)."
  value       = [for h in var.hosts : "${h.address}:${var.listen_port}"]
}
