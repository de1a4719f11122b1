"""/v1/chat/completions: messages rendered by the model's chat template."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from fastapi.responses import Response

from medusa.serve.protocol import APIError, ChatRequest
from medusa.serve.serving import OpenAIServing, encode

if TYPE_CHECKING:
    from medusa.engine.tokenizer import Tokenizer


async def render(tok: Tokenizer, messages: list[dict[str, str]]) -> str:
    """The prompt the model's chat template makes of `messages`, off the event loop; 400 if the
    template refuses them (raise_exception: roles that do not alternate, say) or fails."""
    import jinja2

    try:
        return await asyncio.to_thread(tok.apply_chat_template, messages)
    except (jinja2.TemplateError, TypeError, ValueError) as e:
        raise APIError(
            400, f"messages: the model's chat template cannot render them: {e}", param="messages"
        ) from None


class ServingChat(OpenAIServing):
    route = "chat"
    kind = "chat.completion"
    chunk_kind = "chat.completion.chunk"
    id_prefix = "chatcmpl-"
    prompt_param = "messages"

    async def create(self, req: ChatRequest) -> Response:
        tok = self.admit(req)
        messages = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.content}
            for m in req.messages
        ]
        ids = await encode(tok, await render(tok, messages))
        room = max(1, self.engine.config.max_model_len - len(ids))
        limit = (
            req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        )
        sp = self.prepare(ids, req, room if limit is None else limit)
        return await self.respond(ids, sp, stream=req.stream)

    def choice(self, text: str, reason: str | None, delta: bool) -> dict[str, Any]:
        body = {"content": text} if delta else {"role": "assistant", "content": text}
        return {"index": 0, ("delta" if delta else "message"): body, "finish_reason": reason}

    def first_event(self, head: dict[str, Any]) -> dict[str, Any] | None:
        delta = {"role": "assistant", "content": ""}
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
