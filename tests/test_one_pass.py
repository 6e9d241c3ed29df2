"""One pass per run: ``tlab smoke`` parses its arguments, composes its config, runs its pre-flight
and builds its model once each, and the model the routine trains is the one the pre-flight
built."""

from __future__ import annotations

import argparse
from collections import Counter

import pytest
from hydra._internal.hydra import Hydra

import transformer_lab.app.hydra_app as hydra_app
import transformer_lab.app.preflight as preflight
from transformer_lab.model import TransformerModel


@pytest.fixture
def counts(monkeypatch) -> Counter:
    """Counts of argument parses (tlab's and Hydra's argparse), Hydra composes, pre-flights
    and model constructions while a command runs."""
    counter: Counter = Counter()

    def counting(name, function):
        def wrapper(*args, **kwargs):
            counter[name] += 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(hydra_app, "check_arguments",
                        counting("parse", hydra_app.check_arguments))
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args",
                        counting("parse", argparse.ArgumentParser.parse_args))
    monkeypatch.setattr(Hydra, "compose_config", counting("compose", Hydra.compose_config))
    monkeypatch.setattr(preflight, "preflight", counting("preflight", preflight.preflight))
    monkeypatch.setattr(TransformerModel, "__init__",
                        counting("build_model", TransformerModel.__init__))
    return counter


def test_smoke_parses_composes_preflights_and_builds_once(tlab, tmp_path, counts):
    code, _, err = tlab("experiment=smoke", "pe=rope", f"hydra.run.dir={tmp_path / 'run'}")
    assert code == 0, err
    assert dict(counts) == {"parse": 1, "compose": 1, "preflight": 1, "build_model": 1}


def test_a_sweep_composes_and_preflights_each_job(tlab, tmp_path, counts):
    """A sweep checks its first job up front, then Hydra composes each job, which runs its own
    pre-flight (jobs may run in other processes): 1 + 2 of each for two jobs."""
    code, _, err = tlab("experiment=smoke", "pe=rope,none", "--multirun",
                        f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert code == 0, err
    assert counts["compose"] == 1 + 2 and counts["preflight"] == 1 + 2


def test_the_routine_trains_the_model_the_preflight_built(monkeypatch, tmp_path, tlab):
    built: list[TransformerModel] = []
    trained: list[TransformerModel] = []
    original = preflight.preflight

    def keep(cfg):
        inputs = original(cfg)
        built.append(inputs.model)
        return inputs

    import transformer_lab.routines.smoke as smoke

    original_training = smoke.smoke_training

    def spy(spec, model, *args, **kwargs):
        trained.append(model)
        return original_training(spec, model, *args, **kwargs)

    monkeypatch.setattr(preflight, "preflight", keep)
    monkeypatch.setattr(smoke, "smoke_training", spy)
    code, _, err = tlab("experiment=smoke", f"hydra.run.dir={tmp_path / 'run'}")
    assert code == 0, err
    assert len(built) == 1 and trained == built
