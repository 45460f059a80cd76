"""`exoframe emulate`: a job on an emulated network beside its simulated twin (root, Linux).
The network file is built as namespaces, tc-shaped links and the delay line
(exoframe/emulation); the job runs there under torchrun with `--net real`, then through the
simulator on the same file, and the two clocks are printed side by side."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import click

from ..emulation.netns import QUEUES, EmulationOptions
from ..errors import ExoframeError
from ..sim.network.tcp import CONGESTION_CONTROLS
from .config_flags import field_option
from .group import cli

# Run options the command sets itself (the network, the ranks, the twin's compute, folders)
OWN = ("--net", "--nodes", "--compute", "--out")


@cli.command(context_settings={"ignore_unknown_options": True,
                               "allow_interspersed_args": False})
@field_option("net", required=True, help="The network to emulate: a network YAML file or a "
              "preset name.")
@field_option("nodes", help="Ranks, one network namespace each. [2]")
@click.option("--congestion", type=click.Choice(CONGESTION_CONTROLS),
              help="The ranks' TCP congestion control (the twin models the same). "
                   "[the file's protocol.congestion, else cubic]")
@click.option("--port-queue", type=click.Choice(QUEUES), default=EmulationOptions.port_queue,
              show_default=True, help="The switch's ports' queues to the ranks (their downlinks); "
                   "a link between sites is queued as the file says.")
@click.option("--line-seed", type=int, default=0, show_default=True,
              help="The delay line's draws (jitter, loss).")
@click.option("--keep", type=click.Path(file_okay=False),
              help="Keep both runs' folders here. [a temporary folder, removed]")
@click.argument("run_options", nargs=-1, type=click.UNPROCESSED)
def emulate(net, nodes, congestion, port_queue, line_seed, keep, run_options):
    """Run a job on an emulated NET and in the simulator, and compare their clocks.

    The emulation has the bandwidths, latencies, jitters, losses and queues (the uplinks',
    the links between sites') the network file states (what it leaves out takes the
    model's defaults).

    Give exoframe run's options after `--`, e.g.
    `exoframe emulate --net my-wan.yaml --nodes 4 -- --workload mlp --strategy diloco -p H=5
    --steps 20`. Needs root on Linux (network namespaces, tc); leaves nothing behind.
    """
    from ..emulation.netns import EmulationError, check_can_emulate, leftovers
    from ..emulation.runner import side_by_side

    nodes = 2 if nodes is None else nodes
    own = [arg for arg in run_options if arg.split("=")[0] in OWN]
    if own:
        raise ExoframeError(f"{own[0].split('=')[0]}: give it to `exoframe emulate` before "
                            f"`--` (the command sets {', '.join(OWN)} for both runs).")
    net_file, chosen = _network_file(net, congestion)
    try:
        check_can_emulate()
    except EmulationError as e:
        raise ExoframeError(f"exoframe emulate: {e}") from None
    folder = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="exoframe-emulate-"))
    folder.mkdir(parents=True, exist_ok=True)
    twin_file = folder / "network.yaml"
    twin_file.write_text(net_file)
    tag = f"e{os.getpid()}"
    try:
        done = side_by_side(twin_file, nodes, list(run_options), folder / "runs", tag, chosen,
                            EmulationOptions(port_queue=port_queue),
                            line_seed)
    except EmulationError as e:
        raise ExoframeError(f"exoframe emulate: {e}") from None
    finally:
        left = leftovers(tag)
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
    if left:
        raise ExoframeError(f"exoframe emulate: left behind: {', '.join(left)}")
    click.echo(_table(done, chosen, port_queue))
    if keep:
        click.echo(f"  runs in {folder / 'runs'}")


def _network_file(net: str, congestion: str | None) -> tuple[str, str]:
    """The network file's text for the twin, with the congestion control the emulation
    uses written into its protocol, and that congestion control."""
    import yaml

    from ..inputs import load_yaml
    from ..plugins import PluginManager
    from ..sim.network.netconfig import load_network
    from ..sim.network.tcp import TcpModel, parse_protocol

    config = load_network(net, PluginManager(kinds={"networks"}).networks)
    keys = load_yaml(Path(config.where)) if Path(config.where).is_file() else None
    if not isinstance(keys, dict):
        raise ExoframeError(f"--net {net}: exoframe emulate needs a network file or a preset "
                            f"backed by one.")
    traced = [where for where, scope in [("", keys), *(
        (f"sites.{name}.", site or {}) for name, site in (keys.get("sites") or {}).items()), *(
        (f"links[{i}].", link) for i, link in enumerate(keys.get("links") or []))]
        if isinstance(scope, dict) and scope.get("bandwidth_trace") is not None]
    if traced:
        raise ExoframeError(f"{config.where}: {traced[0]}bandwidth_trace: the emulation keeps "
                            f"each link's bandwidth fixed; emulate the file without it.")
    model = parse_protocol(config.protocol, config.where)
    chosen = congestion or (model.congestion if model else TcpModel().congestion)
    if model is not None:
        protocol = keys.get("protocol")
        keys["protocol"] = {**(protocol if isinstance(protocol, dict) else {}),
                            "congestion": chosen}
    return yaml.safe_dump(keys, sort_keys=False), chosen


def _table(done, congestion: str, port_queue: str) -> str:
    real, simulated = done.real_seconds, done.simulated_seconds
    counts = done.counts
    lost = sum(counts.lost.values())
    return "\n".join([
        f"  emulated (real)       {real:.3f} s   ({congestion}, uplink queues "
        f"{', '.join(sorted(set(done.uplink_queues)))}"
        + (f", links between sites {', '.join(sorted(set(done.link_queues)))}"
           if done.link_queues else "") + f", downlink ports {port_queue})",
        f"  simulated (twin)      {simulated:.3f} s   (compute {done.compute_per_step:.4f} s "
        f"per step, as the slowest real rank took)",
        f"  real / simulated      {real / simulated:.3f}",
        f"  dropped by queues     {sum(counts.dropped.values())} packets; lost on purpose by "
        f"the delay line {lost}; TCP retransmitted {counts.tcp['retransmitted']} segments",
        f"  same losses and bytes "
        f"{'yes' if done.real['bytes_sent_per_rank'] == done.twin['bytes_sent_per_rank'] else 'NO'}",
    ])
