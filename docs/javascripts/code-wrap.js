// A wrapped line of code continues under its own indentation, two columns in, as an editor's
// soft wrap does (extra.css wraps code blocks; mkdocs.yml's line_spans puts each line in a span).
// Without this script a continuation is indented two columns from the block's edge instead.
// Local, no network: the site is read offline too.
document.addEventListener("DOMContentLoaded", () => {
  const lines = document.querySelectorAll(
    '.md-typeset .highlight[class*="language-"]:not(.language-text) > pre > code > span[id^="__span"]');
  for (const line of lines) {
    const lead = line.textContent.match(/^ */)[0].length;
    if (lead > 0) {
      line.style.paddingLeft = `${lead + 2}ch`;
      line.style.textIndent = `-${lead + 2}ch`;
    }
  }
});
