"""/v1/completions: a prompt given as text or as token ids."""

from __future__ import annotations

from typing import Any

from fastapi.responses import Response

from medusa.serve.protocol import CompletionRequest
from medusa.serve.serving import OpenAIServing, encode


class ServingCompletion(OpenAIServing):
    route = "completions"
    kind = chunk_kind = "text_completion"
    id_prefix = "cmpl-"

    async def create(self, req: CompletionRequest) -> Response:
        tok = self.admit(req)
        prompt = req.prompt
        ids = prompt if isinstance(prompt, list) else await encode(tok, prompt)
        sp = self.prepare(ids, req, req.max_tokens)
        return await self.respond(ids, sp, stream=req.stream)

    def choice(self, text: str, reason: str | None, delta: bool) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
