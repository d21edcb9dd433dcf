"""`builder status`: each stack row as the lock, the matrix, the reference figures and the last
`builder bump --newer` describe it (model), as a terminal table or Markdown (text), and as one
static page (page, with its plots in svg); the page adds bench figures over the lock's history
(history) and each image's layer sizes from its build report (model.image_layers)."""
