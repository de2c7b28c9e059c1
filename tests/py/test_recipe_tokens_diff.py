"""Token ids of whole requests, all three APIs: `deepinfer recipe tokens --encoding v4` equals the
package's `DeepseekV4Encoding().with_tokenizer(V4 tokenizer).encode(...)` on generated valid requests.

(V4.1 ids are not compared: no V4.1 tokenizer.json is available to either side.)"""
import json
import subprocess

import pytest

import recipe_gen
import recipe_gen_rm
import recipe_oracle

CORPORA = {
    "chat": (lambda: recipe_gen.chat_requests(20260201, 400), recipe_oracle.render_chat),
    "responses": (lambda: recipe_gen_rm.responses_requests(20260202, 400), recipe_oracle.render_responses),
    "messages": (lambda: recipe_gen_rm.messages_requests(20260203, 400), recipe_oracle.render_messages),
}


@pytest.mark.parametrize("api", list(CORPORA))
def test_token_ids_match(deepinfer, api):
    gen, oracle = CORPORA[api]
    lines = [json.dumps(b, ensure_ascii=False) for b in gen()]
    want = [oracle(line, "v4", ids=True)["ids"] for line in lines]
    p = subprocess.run([deepinfer, "recipe", "tokens", "--api", api, "--encoding", "v4", "--jsonl"],
                       input="".join(l + "\n" for l in lines).encode(), capture_output=True, timeout=600)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    got = [json.loads(x).get("ids") for x in p.stdout.decode().split("\n")[:-1]]
    assert len(got) == len(want)
    bad = [i for i in range(len(want)) if got[i] != want[i]]
    assert not bad, f"{len(bad)}/{len(want)} differ; first: {lines[bad[0]][:600]}"
