"""`retire serve` over HTTP with real clients (openai, httpx, a raw socket), on one server per module.

The server runs in its own process (policy "retire", two tenants from an API-key file, the `unit` shape); the
oracle is a stock vLLM engine of the same shape in this process. Every successor is judged against a clean run of
its token prompt; every refusal is checked for OpenAI's error shape and for leaving the scope as it was.
"""
from __future__ import annotations

import socket
import time

import httpx
import pytest
from vllm import SamplingParams

from conformance.fixtures.engines import EXIT_NOISE
from conformance.fixtures.http import (auth, chat_body, completion_body, error_shape_ok, post, scope_hdr, stream,
                                       usage_cached)
from conformance.fixtures.prompts import name_seed, revise, tokens
from conformance.fixtures.serve_checks import judge, revise_under_stall, scope_state, stream_endings
from conformance.fixtures.servers import ServerProcess, metric, wait_until
from conformance.fixtures.sse_probe import Probe

KEYS = {"key-alpha": "alpha", "key-beta": "beta"}
A, B = "key-alpha", "key-beta"
MAX_BODY = 256 * 1024


@pytest.fixture(scope="module")
def srv(device, pool):
    s = ServerProcess("retire", "unit", api_keys=KEYS, extra=["--max-body-bytes", str(MAX_BODY)],
                      shape_override={"max_model_len": 4096})
    try:
        pool.oracle("unit")  # the oracle engine starts while the server boots
        s.wait_ready()
    except BaseException:
        s.stop()
        raise
    yield s
    try:
        with httpx.Client(base_url=s.url, timeout=60) as c:
            r = c.get("/retire/audit", headers=auth(A))
            assert r.status_code == 200, f"audit after the module: {r.text}"
            m = c.get("/metrics").text
            assert metric(m, "retire_obsolete_tokens_published_total") == 0
    finally:
        rc = s.stop(timeout=30)
    # SIGINT closes the facade, engine included, and the process exits cleanly with no vLLM exit traceback
    assert rc == 0, f"retire serve exited with {rc} after SIGINT:\n{s.log_tail()}"
    assert not any(EXIT_NOISE in line for line in s.lines), s.log_tail(80)


@pytest.fixture
def http(srv):
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def oracle(pool):
    return pool.oracle("unit")


@pytest.fixture
def clean(pool, oracle):
    def run(prompt, n, logprobs=2):
        return pool.runner.run(oracle.clean_run(prompt, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True,
                                                                       logprobs=logprobs)))
    return run


def _chat_ids(messages):
    from transformers import AutoTokenizer

    from conformance.fixtures.tokenizer import ensure_tokenizer

    tok = AutoTokenizer.from_pretrained(ensure_tokenizer())
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


# ---------------------------------------------------------------------------------------------------- endpoints
def test_openai_client_endpoints_match_the_oracle(srv, http, clean):
    """vLLM's own routes through `retire serve`: /v1/models, completions (token ids and text), chat (whole and
    streamed) with the openai client; /health and /metrics (vLLM's metrics plus retire's)."""
    import openai

    assert http.get("/health").status_code == 200
    m = http.get("/metrics").text
    assert metric(m, "vllm:prompt_tokens_total") >= 0 and "retire_serve_ready 1.0" in m
    cli = openai.OpenAI(base_url=srv.url + "/v1", api_key=A, max_retries=0)
    assert [x.id for x in cli.models.list().data] == ["unit"]
    prompt = tokens(40, 3)
    r = cli.completions.create(model="unit", prompt=prompt, max_tokens=12, temperature=0, logprobs=2,
                               extra_body={"ignore_eos": True, "return_token_ids": True,
                                           "return_tokens_as_token_ids": True})
    ch = r.choices[0]
    out = _output_of_completion(ch.model_extra["token_ids"], ch.logprobs)
    assert judge(subject=out, oracle=clean(prompt, 12)).valid, "token-id completion vs oracle"
    text = cli.completions.create(model="unit", prompt="The standard library documents", max_tokens=6,
                                  temperature=0, extra_body={"ignore_eos": True, "return_token_ids": True})
    assert text.choices[0].finish_reason == "length" and len(text.choices[0].model_extra["token_ids"]) == 6
    msgs = [{"role": "user", "content": "Summarize what a cache salt is for."}]
    whole = cli.chat.completions.create(model="unit", messages=msgs, max_tokens=10, temperature=0,
                                        extra_body={"ignore_eos": True, "return_token_ids": True})
    assert whole.model_extra["prompt_token_ids"] == _chat_ids(msgs)  # the server used the shipped chat template
    ref = clean(_chat_ids(msgs), 10)
    assert list(whole.choices[0].model_extra["token_ids"]) == list(ref.tokens)
    streamed = [c for c in cli.chat.completions.create(model="unit", messages=msgs, max_tokens=10, temperature=0,
                                                       stream=True, extra_body={"ignore_eos": True,
                                                                                "return_token_ids": True})]
    ids = [t for c in streamed for ch in c.choices for t in (ch.model_extra.get("token_ids") or ())]
    assert ids == list(ref.tokens) and streamed[-1].choices[0].finish_reason == "length"


def _output_of_completion(ids, lp):
    from conformance.fixtures.http import Output

    tops = tuple({int(k.split(":")[1]): float(v) for k, v in d.items()} for d in lp.top_logprobs)
    return Output(tuple(ids), tuple(float(x) for x in lp.token_logprobs), tops)


# ---------------------------------------------------------------------------------------------------- revision
def test_slow_consumer_revision_writes_zero_obsolete_tokens(srv, clean):
    """A stalled reader (not reading at all while tokens pile up), revised mid-stream: the server writes no token of
    the revoked version after it accepted the SUPERSEDE (kernel byte accounting, see sse_probe), ends the stream
    with "superseded" then [DONE]; the successor matches its oracle. Positive control: test_serve_native."""
    res = revise_under_stall(srv.url, srv.port, "stall-1", key=A)
    assert res.supersede.status_code == 200, res.supersede.text
    assert res.obsolete_tokens == 0, [e.data[:120] for e in res.counted]
    assert res.events[-1].data == "[DONE]" and res.events[-2].finish_reasons == ["superseded"]
    assert all(not e.finish_reasons for e in res.events[:-2]), "one end only"
    body = res.supersede.json()
    assert res.supersede.headers["x-retire-epoch"] == "1" and body["retire"]["epoch"] == 1
    out = _output_of_completion(body["choices"][0]["token_ids"], _LP(body["choices"][0]["logprobs"]))
    v = judge(subject=out, oracle=clean(res.revised, 16))
    assert v.valid, v.detail
    print(f"\nstalled reader: {res.tokens_before_accept} tokens read before the accept, stall send queue "
          f"{res.stall_tx_queue} B, 0 written after it; transition {body['retire']}")


class _LP:
    def __init__(self, d):
        self.token_logprobs, self.top_logprobs = d["token_logprobs"], d["top_logprobs"]


def test_openai_client_revision_chat_stream(srv, clean):
    """The agent's view with the openai client: a slow chat stream under X-Retire-Scope, revised with
    `OpenAI(base_url=.../v1/scopes/{scope}/supersede)` streaming: the old stream ends with finish_reason
    "superseded" and no token after it; the successor's first event carries the transition; its tokens match
    the oracle. On this machine the unit model can finish the old version before the SUPERSEDE is applied (the
    transition then says "predecessor not live"): the old stream then ends by itself with every token, or, if
    frames were still queued behind the slow reader, with "superseded" and no token after it (gate (c))."""
    import openai

    cli = openai.OpenAI(base_url=srv.url + "/v1", api_key=A, max_retries=0)
    sup = openai.OpenAI(base_url=srv.url + "/v1/scopes/chat-1/supersede", api_key=A, max_retries=0)
    msgs = [{"role": "user", "content": "Explain prefix caching in one paragraph."}]
    new = msgs + [{"role": "user", "content": "Shorter, please."}]
    chunks, succ = [], None
    # with_streaming_response: the body is read as it arrives (with_raw_response reads the whole body first, so the
    # old version would have finished before the SUPERSEDE was even sent)
    with cli.chat.completions.with_streaming_response.create(
            model="unit", messages=msgs, max_tokens=1500, temperature=0, stream=True,
            extra_headers={"X-Retire-Scope": "chat-1"}, extra_body={"ignore_eos": True, "return_token_ids": True}) as old:
        assert old.headers["x-retire-epoch"] == "0"
        for c in old.parse():
            chunks.append(c)
            time.sleep(0.02)  # the slow consumer (the fault)
            if len(chunks) == 6:
                succ = sup.chat.completions.with_raw_response.create(
                    model="unit", messages=new, max_tokens=12, temperature=0, stream=True,
                    extra_body={"expected_epoch": 0, "ignore_eos": True, "return_token_ids": True,
                                "logprobs": True, "top_logprobs": 2, "return_tokens_as_token_ids": True})
    ends = [(i, ch.finish_reason) for i, c in enumerate(chunks) for ch in c.choices if ch.finish_reason]
    if succ.headers.get("x-retire-cold-reason") == "predecessor not live":
        # the old version had already finished in the engine when the SUPERSEDE was applied: nothing was left to
        # cut. Either its stream had been written out whole (it ends by itself with every token), or some of its
        # frames were still queued on the server behind the slow reader: the accepted SUPERSEDE then suppresses them
        # (gate (c)) and the stream ends "superseded" with fewer tokens, none after that end
        got = sum(len(ch.model_extra.get("token_ids") or ()) for c in chunks for ch in c.choices)
        assert [e for _, e in ends] in (["length"], ["superseded"]), ends
        assert (got == 1500) if ends[0][1] == "length" else (got < 1500), (ends, got)
    else:
        assert [e for _, e in ends] == ["superseded"], ends
    if ends[0][1] == "superseded":  # the end carries no token, and nothing follows it
        assert not any(ch.model_extra.get("token_ids") for c in chunks[ends[0][0]:] for ch in c.choices)
    assert chunks[0].choices == [] and chunks[0].model_extra["retire"]["epoch"] == 0
    assert succ.headers["x-retire-epoch"] == "1" and "x-retire-fence-latency" in succ.headers
    sc = list(succ.parse())
    assert sc[0].choices == [] and sc[0].model_extra["retire"]["epoch"] == 1
    assert "inherited_tokens" in sc[0].model_extra["retire"]
    toks = [t for c in sc for ch in c.choices for t in (ch.model_extra.get("token_ids") or ())]
    lps = [e for c in sc for ch in c.choices if ch.logprobs for e in ch.logprobs.content]
    from conformance.fixtures.http import Output
    out = Output(tuple(toks), tuple(e.logprob for e in lps),
                 tuple({int(x.token.split(":")[1]): x.logprob for x in e.top_logprobs} for e in lps))
    v = judge(subject=out, oracle=clean(_chat_ids(new), 12))
    assert v.valid, v.detail
    assert sc[-1].choices[0].finish_reason == "length"


def test_session_header_scope_and_get_scope(srv, http):
    """x-session-id names the scope (what session-affinity routers hash on); GET /v1/scopes/{scope} reports the
    epoch and transitions; a second plain request on the same session is refused (409: revise with SUPERSEDE)."""
    p = tokens(50, 11)
    r = post(http, "/v1/completions", completion_body(p, 8), {"x-session-id": "sess-1", **auth(A)})
    assert r.status == 200 and r.headers["x-retire-epoch"] == "0"
    again = post(http, "/v1/completions", completion_body(p, 8), {"x-session-id": "sess-1", **auth(A)})
    assert again.status == 409 and error_shape_ok(again.chunks[0], 409)
    assert again.chunks[0]["error"]["current_epoch"] == 0
    s = post(http, "/v1/scopes/sess-1/supersede", dict(completion_body(revise(p, 40, 50, 2), 8), expected_epoch=0),
             {"x-session-id": "sess-1", **auth(A)})
    assert s.status == 200
    info = http.get("/v1/scopes/sess-1", headers=auth(A)).json()
    assert info["epoch"] == 1 and len(info["transitions"]) == 1 and info["transitions"][0]["epoch"] == 1


# ---------------------------------------------------------------------------------------------------- errors
def _long_scope(http, scope: str, key: str = A):
    """A scope whose current version is running (a long stream, read in the background by the caller)."""
    # a seed fixed per scope name, off the small seeds the other tests use: `hash(str)` is salted per process, so it
    # drew a new prompt each run, and once in a CI run one that another test caches for the same tenant
    # (tokens(64, 41) is the first 64 tokens of tokens(320, 41): 64 cached tokens where the isolation test wants 0)
    p = tokens(64, 20_000 + name_seed(scope, 1000))
    return p, http.stream("POST", "/v1/completions", json=completion_body(p, 150, stream=True, logprobs=None),
                          headers=scope_hdr(scope, key))


ERRORS = {
    "unknown-scope": (404, lambda p: ("/v1/scopes/nope/supersede", dict(completion_body(p, 4), expected_epoch=0), A)),
    "stale-epoch": (409, lambda p: ("/v1/scopes/{s}/supersede", dict(completion_body(p, 4), expected_epoch=3), A)),
    "missing-key": (401, lambda p: ("/v1/scopes/{s}/supersede", dict(completion_body(p, 4), expected_epoch=0), None)),
    "unknown-key": (401, lambda p: ("/v1/scopes/{s}/supersede", dict(completion_body(p, 4), expected_epoch=0), "nokey")),
    "other-tenant": (404, lambda p: ("/v1/scopes/{s}/supersede", dict(completion_body(p, 4), expected_epoch=0), B)),
    "empty-prompt": (400, lambda p: ("/v1/scopes/{s}/supersede", dict(completion_body([], 4), expected_epoch=0), A)),
    "token-out-of-vocab": (400, lambda p: ("/v1/scopes/{s}/supersede",
                                           dict(completion_body([5, 10 ** 6], 4), expected_epoch=0), A)),
    "bad-sampling": (400, lambda p: ("/v1/scopes/{s}/supersede",
                                     dict(completion_body(p, 4, temperature=-1), expected_epoch=0), A)),
    "n-2": (400, lambda p: ("/v1/scopes/{s}/supersede", dict(completion_body(p, 4, n=2), expected_epoch=0), A)),
    "bad-messages": (400, lambda p: ("/v1/scopes/{s}/supersede", {"model": "unit", "messages": "hi",
                                                                  "expected_epoch": 0}, A)),
    "no-epoch": (400, lambda p: ("/v1/scopes/{s}/supersede", completion_body(p, 4), A)),
    "bad-contract": (400, lambda p: ("/v1/scopes/{s}/supersede", dict(completion_body(p, 4), expected_epoch=0,
                                                                     contract={"mode": "bogus"}), A)),
    "oversize-prompt": (400, lambda p: ("/v1/scopes/{s}/supersede",
                                        dict(completion_body(tokens(4100, 5), 4), expected_epoch=0), A)),
    "oversize-body": (413, lambda p: ("/v1/scopes/{s}/supersede",
                                      dict(completion_body(p, 4), expected_epoch=0, pad="x" * (MAX_BODY + 1)), A)),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_refusal_is_an_openai_error_and_leaves_the_scope_intact(srv, http, case):
    status, make = ERRORS[case]
    scope = f"err-{case}"
    p, cm = _long_scope(http, scope)
    with cm as live:
        assert live.status_code == 200
        lines = live.iter_lines()
        next(lines)
        before = scope_state(http, scope, A)
        path, body, key = make(p)
        with httpx.Client(base_url=srv.url, timeout=60) as c2:
            r = c2.post(path.format(s=scope), json=body, headers=auth(key))
        assert r.status_code == status, r.text
        assert error_shape_ok(r.json(), status), r.text
        if status == 409:
            assert r.json()["error"]["current_epoch"] == 0
        assert scope_state(http, scope, A) == before == (200, 0, 0)
        rest = [ln for ln in lines if ln.startswith("data: ")]  # the running version was not touched
    assert rest[-1] == "data: [DONE]" and '"finish_reason":"length"' in rest[-2].replace(" ", "")


def test_negative_control_scope_state_sees_a_change(srv, http):
    """The 'unchanged' checker is not blind: an accepted SUPERSEDE changes what it reports."""
    p = tokens(40, 77)
    assert post(http, "/v1/completions", completion_body(p, 4), scope_hdr("nc-1", A)).status == 200
    before = scope_state(http, "nc-1", A)
    assert post(http, "/v1/scopes/nc-1/supersede", dict(completion_body(p, 4), expected_epoch=0),
                auth(A)).status == 200
    assert scope_state(http, "nc-1", A) != before


# ---------------------------------------------------------------------------------------------------- tenants
def test_other_tenant_cannot_supersede_read_or_alias(http):
    p = tokens(48, 31)
    assert post(http, "/v1/completions", completion_body(p, 4), scope_hdr("shared-name", A)).status == 200
    unknown = http.get("/v1/scopes/never-made", headers=auth(B))
    theirs = http.get("/v1/scopes/shared-name", headers=auth(B))
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.json()["error"]["type"] == unknown.json()["error"]["type"]
    assert post(http, "/v1/scopes/shared-name/supersede", dict(completion_body(p, 4), expected_epoch=0),
                auth(B)).status == 404
    # beta's own scope of the same name is a different scope (no aliasing), and A's is unchanged
    assert post(http, "/v1/completions", completion_body(p, 4), scope_hdr("shared-name", B)).status == 200
    assert scope_state(http, "shared-name", A) == (200, 0, 0) == scope_state(http, "shared-name", B)
    # positive control: the owner reads it
    assert http.get("/v1/scopes/shared-name", headers=auth(A)).status_code == 200


def test_tenants_get_no_prefix_cache_hits_on_each_other(http):
    """vLLM's own count (usage.prompt_tokens_details.cached_tokens). Positive controls: the same tenant (and the
    same tenant + client salt) does hit."""
    p = tokens(320, 41)

    def cached(key, salt=None, scope=None):
        b = completion_body(p, 2, logprobs=None, **({"cache_salt": salt} if salt else {}))
        h = scope_hdr(scope, key) if scope else auth(key)
        r = post(http, "/v1/completions", b, h)
        assert r.status == 200, r.chunks
        return usage_cached(r.chunks[0])

    assert cached(A) == 0
    assert cached(A) >= 256                       # positive control: alpha hits its own prefix
    assert cached(B) == 0                         # beta shares the prompt, not the cache
    assert cached(B, scope="iso-b") >= 256        # beta's second run hits its own (scoped path: same namespace)
    assert cached(A, salt="team-x") == 0          # a client salt is a namespace inside the tenant
    assert cached(B, salt="team-x") == 0          # ... and the same client salt in another tenant is another one
    assert cached(A, salt="team-x") >= 256


# ---------------------------------------------------------------------------------------------------- faults
def _running(http) -> float:
    return metric(http.get("/metrics").text, "vllm:num_requests_running")


def test_supersede_whose_client_leaves_before_the_first_token(srv, http):
    """The SUPERSEDE is accepted (epoch 1 is current) but its client leaves before the successor's first token: the
    successor is aborted, the scope stays at epoch 1 and takes the next SUPERSEDE; nothing leaks (module audit)."""
    p0 = tokens(64, 61)
    assert post(http, "/v1/completions", completion_body(p0, 4), scope_hdr("leave-1", A)).status == 200
    probe = Probe("127.0.0.1", srv.port)
    probe.request("/v1/scopes/leave-1/supersede",
                  dict(completion_body(tokens(64, 62), 1500, stream=True, logprobs=None), expected_epoch=0),
                  auth(A))
    assert probe.status == 200 and probe.headers["x-retire-epoch"] == "1"
    probe.sock.shutdown(socket.SHUT_RDWR)  # gone before reading any event
    probe.close()
    wait_until(lambda: _running(http) == 0, 30, "the orphaned successor to leave the engine")
    assert scope_state(http, "leave-1", A) == (200, 1, 1)
    r = post(http, "/v1/scopes/leave-1/supersede", dict(completion_body(tokens(64, 63), 4), expected_epoch=1),
             auth(A))
    assert r.status == 200 and r.headers["x-retire-epoch"] == "2"


def test_stream_ending_checker_negative_controls():
    """`stream_endings` reports a stream with two ends, one with tokens after its end, and one without [DONE]."""
    from conformance.fixtures.http import Transcript

    ok = Transcript(200, {}, [{"choices": [{"token_ids": [1]}]}, {"choices": [{"finish_reason": "length"}]}], True)
    two = Transcript(200, {}, [{"choices": [{"finish_reason": "superseded"}]},
                               {"choices": [{"finish_reason": "length"}]}], True)
    late = Transcript(200, {}, [{"choices": [{"finish_reason": "superseded"}]},
                                {"choices": [{"token_ids": [3]}]}], True)
    nodone = Transcript(200, {}, [{"choices": [{"finish_reason": "stop"}]}], False)
    assert stream_endings(transcripts=[ok]).valid
    for bad in (two, late, nodone):
        assert stream_endings(transcripts=[ok, bad]).valid is False
