"""One module per upstream SGLang module the plugin hooks; a file's name is the tail of that
module's dotted path (`moe_utils` hooks `sglang.srt.layers.moe.utils`). `hooks.GLUE_MODULES`
lists them in registration order."""
