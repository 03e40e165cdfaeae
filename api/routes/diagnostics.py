"""Diagnostic bundles, read-only: the list, one bundle's summary and files, one file's bytes.

Every read goes through `api.bundles` (descriptors, no links) in a worker thread.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.responses import Response, StreamingResponse

from api import bundles
from api.deps import Context
from api.errors import error_response
from api.models import BundleDetail, BundleList
from api.responses import NOT_FOUND

router = APIRouter(tags=["diagnostics"])


@router.get("/diagnostics", response_model=BundleList)
async def diagnostics(ctx: Context) -> BundleList:
    """Diagnostic bundles, newest first, with their summaries."""
    return BundleList(bundles=await ctx.pool.run(bundles.list_bundles, ctx.diag_dir))


@router.get("/diagnostics/{bundle_id}", response_model=BundleDetail, responses=NOT_FOUND)
async def diagnostic(bundle_id: str, ctx: Context) -> Any:
    detail = await ctx.pool.run(bundles.bundle_detail, ctx.diag_dir, bundle_id)
    if detail is None:
        return error_response(404, "not_found", "no such bundle")
    return detail


@router.get(
    "/diagnostics/{bundle_id}/{name}",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "the file's content",
            "content": {"text/plain": {"schema": {"type": "string"}}, "application/json": {}},
        },
        **NOT_FOUND,
    },
)
async def diagnostic_file(bundle_id: str, name: str, ctx: Context) -> Response:
    fd = await ctx.pool.run(bundles.open_bundle_file, ctx.diag_dir, bundle_id, name)
    if fd is None:
        return error_response(404, "not_found", "no such file in that bundle")
    return StreamingResponse(
        bundles.read_chunks(fd),
        media_type=bundles.media_type(name),
        headers={"X-Content-Type-Options": "nosniff"},
    )
