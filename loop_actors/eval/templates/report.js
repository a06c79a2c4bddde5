(function () {
  function show(which) {
    document.querySelectorAll('[data-status]').forEach(function (el) {
      var keep = which === 'all' || el.getAttribute('data-status') === which;
      el.style.display = keep ? '' : 'none';
    });
  }
  document.querySelectorAll('button[data-show]').forEach(function (button) {
    button.addEventListener('click', function () { show(button.getAttribute('data-show')); });
  });
  document.querySelectorAll('button[data-open]').forEach(function (button) {
    button.addEventListener('click', function () {
      var open = button.getAttribute('data-open') === 'all';
      document.querySelectorAll('details.case').forEach(function (d) { d.open = open; });
    });
  });
})();
