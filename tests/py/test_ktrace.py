"""tools/ktrace.py on hand-written timelines: the critical chain walked back from the last record, charges that add
up to its span, cross-stream waits, gaps, host API records kept out of the chain, names cut from mangled symbols."""
import pytest

from conftest import load_tool

kt = load_tool("ktrace")

HDR = "kind,stream,start_ns,end_ns,node,grid,block,name\n"

# lane 7: a (0-10), b (8-30: PDL, started before a ended), d (35-40); lane 9: c (10-25, after a);
# e on lane 9 at 41-50 (after d, an event wait); a host call R that must not enter the chain
TIMELINE = HDR + "\n".join([
    "K,7,0,10000,0,1,32,_Z1aPf",
    "K,7,8000,30000,0,1,32,_ZN41_GLOBAL__N__f91a1e30_9_moe_wg_cu_638b75699wv_kernelILi1ELi2ELi6EEEv11bcu_wg_args",
    "K,9,10000,25000,0,1,32,_Z1cPf",
    "C,7,31000,32000,0,0,0,memcpy kind 1, 64 bytes",
    "K,7,35000,40000,0,1,32,_Z1dPf",
    "K,9,41000,50000,0,1,32,_Z1ePf",
    "R,4242,0,60000,0,0,0,cudaGraphLaunch_v10000",
]) + "\n"


def write(tmp_path, text):
    p = tmp_path / "t.csv"
    p.write_text(text)
    return str(p)


def test_names():
    assert kt.itanium_name("_Z3fooPf") == "foo"
    assert kt.itanium_name(
        "_ZN41_GLOBAL__N__f91a1e30_9_moe_wg_cu_638b75699wv_kernelILi1ELi2ELi6EEEv11bcu_wg_args") == "wv_kernel"
    assert kt.itanium_name("nvjet_sm90_tss_128x8") == "nvjet_sm90_tss_128x8"


def test_chain_and_charges(tmp_path, capsys):
    p = write(tmp_path, TIMELINE)
    assert kt.main([p, "--chain"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    # the host call is not a GPU record: 6 records, span 0-50 us
    assert lines[0].startswith("6 records on 2 streams, span 50.0 us, something running 45.0 us (90.0%)")
    assert "critical chain: 5 records, 50.0 us from 0.0 us" in out
    table = {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[2:5]] for l in lines if l.startswith("| ")
             and not l.startswith("| kernel") and not l.startswith("| ---")}
    # a 10, b 30 - 10 = 20, the copy 2, d 8, e 10 (after d, another stream): c is off the chain
    assert table["a"] == ["1", "10.0", "10.0"]
    assert table["wv_kernel"] == ["1", "20.0", "22.0"]
    assert table["memcpy kind 1"] == ["1", "2.0", "1.0"]
    assert table["d"] == ["1", "8.0", "5.0"]
    assert table["e"] == ["1", "10.0", "9.0"]
    assert "c" not in table
    assert sum(float(v[1]) for v in table.values()) == pytest.approx(50.0)


def test_gaps_and_window(tmp_path, capsys):
    p = write(tmp_path, TIMELINE)
    assert kt.main([p, "--gaps", "2", "--window=30:45"]) == 0
    out = capsys.readouterr().out
    assert "nothing running: 5.0 us in 3 gaps; the longest:" in out
    assert "at     32.0 us    3.0 us  memcpy kind 1 -> d" in out
    win = out.split("critical chain")[0]
    assert "memcpy kind 1" in win and " d" in win and " e" in win
    assert "cudaGraphLaunch" not in win  # it started at 0, outside the window


def test_not_a_listing(tmp_path):
    p = write(tmp_path, "a,b\n1,2\n")
    with pytest.raises(SystemExit):
        kt.main([p])
    with pytest.raises(SystemExit):
        kt.main([write(tmp_path, HDR)])
