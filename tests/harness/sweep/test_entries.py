import pytest

from harness.sweep import testzoo
from harness.sweep.entries import SelectionError, load_entries, parse_shard, shard
from harness.sweep.options import SweepOptions


def test_test_zoo_spec():
    ids = [e.id for e in testzoo.parse_spec("test:pass*3,abort")]
    assert ids == ["test/pass_000", "test/pass_001", "test/pass_002", "test/abort"]
    assert {e.kind for e in testzoo.parse_spec("test")} == set(testzoo.DEFAULT_SET)
    with pytest.raises(ValueError, match="unknown test entry 'nope'"):
        testzoo.parse_spec("test:nope")


def test_shards_partition_deterministically():
    entries = testzoo.parse_spec("test:pass*10,slow*7")
    parts = [shard(entries, (i, 3)) for i in (1, 2, 3)]
    ids = [e.id for p in parts for e in p]
    assert sorted(ids) == sorted(e.id for e in entries) and len(set(ids)) == len(ids)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert [e.id for e in shard(list(reversed(entries)), (2, 3))] == [e.id for e in parts[1]]


@pytest.mark.parametrize("text", ["0/2", "3/2", "1-2", "a/b", "1/0"])
def test_bad_shard(text):
    with pytest.raises(SelectionError):
        parse_shard(text)


def test_selection_and_bad_input():
    opts = SweepOptions(zoo="test:pass*4,raise", match=r"pass_00[12]")
    assert [e.id for e in load_entries(opts)] == ["test/pass_001", "test/pass_002"]
    with pytest.raises(SelectionError, match="unknown zoo"):
        load_entries(SweepOptions(zoo="nosuchzoo"))
    with pytest.raises(SelectionError, match="bad --match regex"):
        load_entries(SweepOptions(zoo="test", match="(unclosed"))


def test_malformed_models_list_names_the_problem(tmp_path):
    p = tmp_path / "models.csv"
    p.write_text("not_a_model_id_column,x\n1,2\n")
    with pytest.raises(SelectionError, match="models list"):
        load_entries(SweepOptions(zoo=str(p)))
