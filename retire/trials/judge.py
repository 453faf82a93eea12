"""Judge: checks a successor against clean oracle runs on a stock vLLM engine (cached per revised prompt and reused
length).

Rules:
- the successor produced exactly `max_tokens` tokens;
- a successor reported cold (reused 0) must also be cold by vLLM's own count: the `num_cached_tokens` vLLM put on
  its frames is 0 (a cold successor that read the prefix cache is a failure even if its tokens match);
- exact against the mode-matched reference: `clean_run` if nothing was reused, else
  `clean_prefix_run(revised[:reused], revised)` provided the oracle also reused exactly that much; native-cold must
  pass that (when the oracle engine has the subject's execution shape);
- otherwise the logprob-closeness rule against `clean_run` ("tolerant").
"""
from __future__ import annotations


class Judge:
    def __init__(self, oracle, block_size: int = 32, *, same_shape: bool = True):
        """`same_shape=False` when the subject runs a prefill unit the oracle engine cannot reproduce (a unit set at
        run time with `set_step_tokens` above the oracle's chunk): the exact rule then does not apply to anyone, and
        native-cold is judged by the closeness rule like the other policies."""
        self.oracle = oracle
        self.block = block_size
        self.same_shape = same_shape
        self._clean: dict = {}
        self._prefix: dict = {}

    async def clean(self, revised, sp):
        k = (tuple(revised), repr(sp))
        if k not in self._clean:
            self._clean[k] = await self.oracle.clean_run(revised, sp)
        return self._clean[k]

    async def prefix(self, revised, n: int, sp):
        k = (tuple(revised), n, repr(sp))
        if k not in self._prefix:
            self._prefix[k] = await self.oracle.clean_prefix_run(revised[:n], revised, sp)
        return self._prefix[k]

    async def check(self, policy: str, revised, sp, new, reused: int) -> tuple[bool, str]:
        from oracles import compare_logprobs_close, compare_tokens

        if len(new.tokens) != sp.max_tokens:
            return False, f"FAIL: successor produced {len(new.tokens)} of {sp.max_tokens} tokens"
        cached = getattr(new, "num_cached_tokens", None)
        if reused == 0 and cached:
            return False, f"FAIL: reported cold, but vLLM counted {cached} prefix-cache tokens on its frames"
        exact_detail = ""
        if reused == 0:
            v = compare_tokens(subject=new, oracle=await self.clean(revised, sp), subject_name=policy,
                               oracle_name="clean_run")
            if v:
                return True, "exact vs clean_run"
            exact_detail = v.detail
        elif reused % self.block == 0 and reused < len(revised):
            ref = await self.prefix(revised, reused, sp)
            if ref.inherited_tokens == reused:
                v = compare_tokens(subject=new, oracle=ref, subject_name=policy, oracle_name="clean_prefix_run")
                if v:
                    return True, f"exact vs clean_prefix_run[:{reused}]"
                exact_detail = v.detail
            else:
                exact_detail = f"oracle reused {ref.inherited_tokens}, not {reused}"
        if policy == "native-cold" and self.same_shape:
            return False, f"FAIL exact: {exact_detail}"
        v = compare_logprobs_close(subject=new, oracle=await self.clean(revised, sp), subject_name=policy,
                                   oracle_name="clean_run")
        if v:
            return True, "tolerant vs clean_run"
        return False, f"FAIL: {v.detail} (exact: {exact_detail})"
