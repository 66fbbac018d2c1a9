// Optional: "select all" for the table's checkboxes. Everything else works without JavaScript.
document.getElementById("all")?.addEventListener("change", (e) => {
  document.querySelectorAll('input[name="ids"]').forEach((box) => { box.checked = e.target.checked; });
});
