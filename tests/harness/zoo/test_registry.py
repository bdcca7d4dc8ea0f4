"""Listing: sizes of the built-in zoo, stable ids, the smoke subset, selection."""

import pytest

from harness.zoo import ZooEntry, load_zoo, select


def test_full_zoo_size_and_unique_ids():
    full = load_zoo("full")
    libraries = [e.library for e in full]
    assert libraries.count("transformers") >= 1500
    assert libraries.count("diffusers") >= 60
    assert len({e.id for e in full}) == len(full)


def test_ids_are_stable_across_loads():
    assert [e.id for e in load_zoo("full")] == [e.id for e in load_zoo("full")]
    assert load_zoo("smoke") == load_zoo("smoke")


def test_id_shapes():
    full = load_zoo("full")
    for e in full:
        if e.library == "transformers":
            assert e.id == f"transformers/{e.model_type}/{e.model_class}"
        elif e.task == "pipeline":
            assert e.id.startswith("diffusers/pipeline/")
        else:
            assert e.id.startswith("diffusers/") and e.id.count("/") == 1


def test_smoke_covers_every_task_family_of_both_libraries():
    full, smoke = load_zoo("full"), load_zoo("smoke")
    assert 40 <= len(smoke) <= 60
    from harness.zoo.smoke import UNCOVERED_TASKS

    assert {e.task for e in smoke} == {e.task for e in full} - set(UNCOVERED_TASKS)
    assert {e.library for e in smoke} == {"transformers", "diffusers"}


def test_select():
    full = load_zoo("full")
    llama = select(full, library="transformers", task="causal-lm", match=r"/llama/")
    assert [e.id for e in llama] == ["transformers/llama/LlamaForCausalLM"]
    assert all(e.library == "diffusers" for e in select(full, library="diffusers"))
    with pytest.raises(ValueError, match="invalid --match regex"):
        select(full, match="(")


def test_unknown_spec():
    with pytest.raises(ValueError, match="unknown zoo spec"):
        load_zoo("everything")
    with pytest.raises(ValueError, match="no such models-list"):
        load_zoo("/nonexistent/models.csv")


def test_entries_are_hashable_values():
    e = ZooEntry(id="x", library="transformers", model_type="llama", model_class="LlamaModel", task="feature-extraction")
    assert e == ZooEntry(**{**e.__dict__})
    assert len({e, e}) == 1
