"""tools/ncu_agg.py on hand-written ncu --csv listings: names folded, calls and microseconds summed, two side by side."""
import pytest

from conftest import load_tool

na = load_tool("ncu_agg")

HDR = '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",' \
      '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n'


def row(i, name, metric, value):
    return f'"{i}","1","b","h","{name}","1","7","(128, 1, 1)","(8, 1, 1)","0","9.0","s","{metric}","ns","{value}"\n'


BEFORE = ("bench output line\n==WARNING== something\n" + HDR
          + row(0, "void (anonymous namespace)::wg_kernel<1, 1>(bcu_wg_args)", "gpu__time_duration.sum", "35,000")
          + row(0, "void (anonymous namespace)::wg_kernel<1, 1>(bcu_wg_args)", "smsp__inst_executed.sum", "9,999")
          + row(1, "void (anonymous namespace)::wg_kernel<2, 1>(bcu_wg_args)", "gpu__time_duration.sum", "20,500")
          + row(2, "void rowdec_kernel<3, 1, 1>(MmArgs)", "gpu__time_duration.sum", "7,250"))
AFTER = (HDR + row(0, "void (anonymous namespace)::wg_kernel<1, 1>(bcu_wg_args)", "gpu__time_duration.sum", "30,000")
         + row(1, "void rowdec_kernel<3, 1, 1>(MmArgs)", "gpu__time_duration.sum", "7,000")
         + row(2, "void rowdec_kernel<3, 2, 1>(MmArgs)", "gpu__time_duration.sum", "14,000"))


def files(tmp_path):
    b, a = tmp_path / "b.csv", tmp_path / "a.csv"
    b.write_text(BEFORE)
    a.write_text(AFTER)
    return str(b), str(a)


def test_two_listings_side_by_side(tmp_path, capsys):
    b, a = files(tmp_path)
    assert na.main([b, a]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "3 kernels, 62.8 us -> 3 kernels, 51.0 us"
    # sorted by the last listing: wg_kernel (30.0) before rowdec_kernel (21.0)
    assert out[1].split() == ["55.5", "(", "2)", "->", "30.0", "(", "1)", "wg_kernel"]
    assert out[2].split() == ["7.2", "(", "1)", "->", "21.0", "(", "2)", "rowdec_kernel"]


def test_args_and_other_metric(tmp_path, capsys):
    b, _ = files(tmp_path)
    assert na.main([b, "--args"]) == 0
    out = capsys.readouterr().out
    assert "wg_kernel<2, 1>(bcu_wg_args)" in out and "35.0 (  1)  wg_kernel<1, 1>(bcu_wg_args)" in out
    assert na.main([b, "--metric", "smsp__inst_executed.sum"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "1 kernels, 9,999.0" and out[1].split()[-1] == "wg_kernel"


def test_not_a_listing(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("no header here\n")
    with pytest.raises(SystemExit):
        na.main([str(p)])


def test_a_value_that_is_not_a_number(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text(HDR + row(0, "void k(int)", "gpu__time_duration.sum", "n/a"))
    with pytest.raises(SystemExit, match="not a number"):
        na.main([str(p)])
