"""tools/sass_hist.py on a hand-written SASS listing: the loop it picks, its counts, --skip and --range."""
from conftest import load_tool

sh = load_tool("sass_hist")

LISTING = """
	code for sm_90a
		Function : _Z5otherv
        /*0000*/                   MOV R1, c[0x0][0x28] ;            /* 0x00000a0000017a02 */
        /*0010*/                   EXIT ;                           /* 0x000000000000794d */
		Function : _Z6kernelPf
        /*0000*/                   MOV R1, c[0x0][0x28] ;            /* 0x00000a0000017a02 */
        /*0010*/                   LOP3.LUT R2, R3, 0xff, RZ, 0xc0, !PT ;
        /*0020*/                   IADD3 R4, R4, 0x1, RZ ;
        /*0030*/                   LOP3.LUT R5, R2, 0xf, RZ, 0xc0, !PT ;
        /*0040*/                   HMMA.16816.F32 R8, R12, R16, R8 ;
        /*0050*/              @!P0 BRA 0x80 ;
        /*0060*/                   IMAD.SHL.U32 R6, R6, 0x10, RZ ;
        /*0070*/                   HMMA.16816.F32 R8, R12, R18, R8 ;
        /*0080*/                   ISETP.NE.AND P1, PT, R4, R7, PT ;
        /*0090*/               @P1 BRA 0x20 ;
        /*00a0*/                   LOP3.LUT R9, R9, 0x1, RZ, 0xc0, !PT ;
        /*00b0*/                   BRA 0x10 ;
        /*00c0*/                   EXIT ;
"""


def run(tmp_path, capsys, *args):
    f = tmp_path / "k.sass"
    f.write_text(LISTING)
    rc = sh.main([str(f), *args])
    return rc, capsys.readouterr().out


def test_picks_the_smallest_loop_with_the_most_matrix_instructions(tmp_path, capsys):
    rc, out = run(tmp_path, capsys, "--kernel", "kernel")
    assert rc == 0
    # both backward branches hold the two HMMAs; the one from 0x20 to 0x90 is the smaller body
    assert "loop 0x20..0x90: 8 instructions, 2 matrix, 4.0 per matrix instruction" in out
    assert "     2  HMMA" in out and "     2  BRA" in out and "     1  LOP3" in out
    assert "_Z5otherv" not in out


def test_full_opcodes_skip_and_range(tmp_path, capsys):
    rc, out = run(tmp_path, capsys, "--kernel", "kernel", "--full", "--skip", "60:80")
    assert rc == 0
    assert "loop 0x20..0x90: 6 instructions, 1 matrix" in out
    assert "HMMA.16816.F32" in out and "IMAD.SHL.U32" not in out
    rc, out = run(tmp_path, capsys, "--kernel", "kernel", "--range", "0:c0")
    assert "loop 0x0..0xc0: 13 instructions, 2 matrix" in out


def test_no_match_is_an_error(tmp_path, capsys):
    f = tmp_path / "k.sass"
    f.write_text(LISTING)
    assert sh.main([str(f), "--kernel", "nosuch"]) == 1
    assert "no function matches" in capsys.readouterr().err
