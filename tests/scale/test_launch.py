"""The launcher (bertflow.scale.launch): the topology read from torchrun's and SLURM's variables."""

from __future__ import annotations

from bertflow.scale.launch import Topology


def test_topology_from_torchrun_and_slurm_variables():
    assert Topology.from_env({}) == Topology(0, 1, 0, 1)
    torchrun = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    assert Topology.from_env(torchrun) == Topology(5, 8, 1, 4)
    slurm = {"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_TASKS_PER_NODE": "4(x2)"}
    assert Topology.from_env(slurm) == Topology(6, 8, 2, 4)
    # One SLURM task that runs torchrun: its workers read torchrun's variables.
    assert Topology.from_env({**slurm, "SLURM_NTASKS": "1", **torchrun}) == Topology(5, 8, 1, 4)
